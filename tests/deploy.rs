//! The Kubernetes files in `deploy/kubernetes/` against the code they
//! deploy: the ConfigMap's policy is one the coordinator accepts and
//! sorts pods into tenants as its comments say, the DaemonSet passes the
//! coordinator only flags it takes, and the coordinator, the tenant pod
//! and the preload library agree on the paths they share.

use std::path::Path;

use mtrdma::core::policy::PeerCredentials;
use mtrdma::core::Policy;

fn read(file: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn indent(line: &str) -> usize {
    line.len() - line.trim_start().len()
}

/// The lines after the first line that is `key` (trimmed), as long as
/// they are indented deeper than it or blank, with that key's item
/// indentation taken off: a YAML block scalar or a block under a key.
fn block_after(yaml: &str, key: &str) -> Vec<String> {
    let mut lines = yaml.lines();
    let at = lines
        .by_ref()
        .find(|l| l.trim() == key)
        .unwrap_or_else(|| panic!("no `{key}` in the file"));
    let base = indent(at);
    let block: Vec<&str> = lines
        .take_while(|l| l.trim().is_empty() || indent(l) > base)
        .collect();
    let inner = block
        .iter()
        .filter(|l| !l.trim().is_empty())
        .map(|l| indent(l))
        .min()
        .unwrap_or(0);
    block
        .iter()
        .map(|l| l.get(inner..).unwrap_or("").to_string())
        .collect()
}

/// The items of the YAML list of strings under `key` (`- "item"`).
fn list_after(yaml: &str, key: &str) -> Vec<String> {
    block_after(yaml, key)
        .iter()
        .filter_map(|l| l.trim().strip_prefix("- "))
        .map(|item| item.trim_matches('"').to_string())
        .collect()
}

/// `field`'s value (unquoted) in the first list entry `- name: NAME` (a
/// container's, a volume mount's, a volume's) that has it: entries end
/// where the indentation comes back to their dash.
fn entry_value(yaml: &str, name: &str, field: &str) -> String {
    let lines: Vec<&str> = yaml.lines().collect();
    let head = format!("- name: {name}");
    for (i, line) in lines.iter().enumerate() {
        if line.trim() != head {
            continue;
        }
        let dash = indent(line);
        let found = lines[i + 1..]
            .iter()
            .take_while(|l| l.trim().is_empty() || indent(l) > dash)
            .find_map(|l| l.trim().strip_prefix(field));
        if let Some(value) = found {
            return value.trim().trim_matches('"').to_string();
        }
    }
    panic!("no entry `{head}` with `{field}`")
}

/// The value after `flag` in the coordinator's arguments.
fn arg(args: &[String], flag: &str) -> String {
    let at = args.iter().position(|a| a == flag);
    at.and_then(|i| args.get(i + 1))
        .unwrap_or_else(|| panic!("no {flag} in {args:?}"))
        .clone()
}

#[test]
fn the_configmaps_policy_sorts_pods_into_tenants_by_qos_class() {
    let yaml = read("deploy/kubernetes/coordinator.yaml");
    let toml = block_after(&yaml, "policy.toml: |").join("\n");
    let policy = Policy::from_toml_str(&toml).unwrap_or_else(|e| panic!("{e}\n{toml}"));
    let tenant = |gid: u32, cgroup: &str| {
        let peer = PeerCredentials {
            pid: 1,
            uid: 1000,
            gid,
            cgroup: Some(cgroup.to_string()),
        };
        policy.tenant_for_peer(&peer).map(|t| t.name.clone())
    };
    let pod = "kubepods-pod0f3c2a1b_8f6e_4c1d_9a2b_7e5d4c3b2a10.slice/cri-containerd-1a2b.scope";
    let besteffort = format!("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-{pod}");
    let burstable = format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-{pod}");
    let guaranteed = format!("/kubepods.slice/{pod}");
    assert_eq!(tenant(0, &besteffort).as_deref(), Some("besteffort"));
    assert_eq!(tenant(0, &burstable).as_deref(), Some("burstable"));
    assert_eq!(tenant(0, &guaranteed).as_deref(), Some("guaranteed"));
    assert_eq!(tenant(3000, &guaranteed).as_deref(), Some("burstable"));
    assert_eq!(
        tenant(3000, &besteffort).as_deref(),
        Some("besteffort"),
        "the BestEffort tenant comes first"
    );
    assert_eq!(tenant(0, "/system.slice/sshd.service"), None);
}

#[test]
fn the_daemonset_passes_the_coordinator_flags_it_takes_and_paths_the_pods_share() {
    let yaml = read("deploy/kubernetes/coordinator.yaml");
    let pod = read("deploy/kubernetes/tenant-pod.yaml");
    let coordinator = read("examples/coordinator.rs");
    let args = list_after(&yaml, "args:");
    for flag in args.iter().filter(|a| a.starts_with("--")) {
        assert!(
            coordinator.contains(&format!("\"{flag}\" =>")),
            "examples/coordinator.rs takes no {flag}"
        );
    }

    // The policy: the ConfigMap's key, where its volume is mounted.
    let policy = arg(&args, "--policy");
    let policy_dir = entry_value(&yaml, "policy", "mountPath:");
    assert_eq!(policy, format!("{policy_dir}/policy.toml"));

    // The socket: in the host directory both mount, where the tenants
    // look for it.
    let socket = arg(&args, "--socket");
    let socket_dir = entry_value(&yaml, "socket", "mountPath:");
    assert_eq!(Path::new(&socket).parent(), Some(Path::new(&socket_dir)));
    assert_eq!(
        entry_value(&yaml, "socket", "path:"),
        entry_value(&pod, "mtrdma-socket", "path:"),
        "one host directory"
    );
    assert_eq!(entry_value(&pod, "mtrdma-socket", "mountPath:"), socket_dir);
    let env = mtrdma::core::tenant::ENV_COORDINATOR;
    assert_eq!(entry_value(&pod, env, "value:"), socket);

    // The preload library: the file the init container copies to the
    // host directory the tenant pod mounts, by the name the crate builds.
    let preload = entry_value(&pod, "LD_PRELOAD", "value:");
    let lib_dir = entry_value(&pod, "mtrdma-lib", "mountPath:");
    let file = Path::new(&preload).file_name().unwrap().to_str().unwrap();
    assert_eq!(Path::new(&preload).parent(), Some(Path::new(&lib_dir)));
    assert_eq!(
        entry_value(&yaml, "lib", "path:"),
        entry_value(&pod, "mtrdma-lib", "path:")
    );
    assert!(yaml.contains(&format!("/opt/mtrdma/{file}")), "{file}");
    let crate_toml = read("mtrdma-preload/Cargo.toml");
    let lib_name = file
        .strip_prefix("lib")
        .and_then(|f| f.strip_suffix(".so"))
        .unwrap();
    assert!(
        crate_toml.contains(&format!("name = \"{lib_name}\"")),
        "mtrdma-preload builds lib{lib_name}.so"
    );
    let dockerfile = read("deploy/kubernetes/Dockerfile");
    assert!(dockerfile.contains(&format!("/opt/mtrdma/{file}")));
}
