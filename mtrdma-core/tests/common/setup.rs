//! A coordinator's files for a test, in a directory of their own: its
//! policy, socket and table, removed when the test is done (the
//! coordinator tests' and the etcd tests' alike).

// Each test binary that includes it uses a part of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use mtrdma_core::coordinator::CoordinatorConfig;
use mtrdma_core::QuotaTable;

pub(crate) struct Setup {
    pub(crate) dir: PathBuf,
    pub(crate) config: CoordinatorConfig,
}

impl Setup {
    /// Files named for `tag`, the policy file holding `policy`.
    pub(crate) fn new(tag: &str, policy: &str) -> Setup {
        let name = format!("coord-{tag}-{}", std::process::id());
        let dir = std::env::temp_dir().join(&name);
        std::fs::create_dir_all(&dir).unwrap();
        let policy_path = dir.join("policy.toml");
        std::fs::write(&policy_path, policy).unwrap();
        Setup {
            config: CoordinatorConfig {
                table: name,
                socket: dir.join("sock"),
                policy_path,
                capacity: 8,
                processes: 8,
            },
            dir,
        }
    }

    pub(crate) fn write_policy(&self, policy: &str) {
        // A new modification time even on coarse-grained file systems.
        let path: &Path = &self.config.policy_path;
        std::fs::write(path, policy).unwrap();
        let later = std::time::SystemTime::now() + std::time::Duration::from_secs(2);
        std::fs::File::options()
            .write(true)
            .open(path)
            .unwrap()
            .set_modified(later)
            .unwrap();
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        let _ = QuotaTable::remove(&self.config.table);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
