//! `cargo xtask vm --link RATE`: a shared bottleneck link inside the VM.
//!
//! Two SoftRoCE devices sit on the two ends of one veth pair, both in the
//! guest's initial network namespace: `rxa` (the sender host, 192.168.77.1
//! on `va`) and `rxb` (the receiver host, 192.168.77.2 on `vb`). Traffic
//! between them leaves through a real network device and its queue, like a
//! NIC port: rxe's loopback path (two QPs of one device) never queues.
//!
//! For the kernel to send a packet for one of its own addresses out of a
//! device instead of delivering it locally, the `local` routing table moves
//! behind two rules (`iif lo` to each end's address goes out of the other
//! end), neighbours are static, and `accept_local` lets each end take
//! packets from a local source. Each end then gets a `tbf` qdisc at RATE
//! (both directions are shaped: READ responses and ACKs flow back), or
//! none with `unshaped`.

use anyhow::{bail, Context as _, Result};

use crate::proc;

/// The sender host's RDMA device (on `va`, 192.168.77.1).
pub(crate) const SENDER: &str = "rxa";
/// The receiver host's RDMA device (on `vb`, 192.168.77.2).
pub(crate) const RECEIVER: &str = "rxb";
pub(crate) const SENDER_IP: &str = "192.168.77.1";
pub(crate) const RECEIVER_IP: &str = "192.168.77.2";
const SENDER_NETDEV: &str = "va";
const RECEIVER_NETDEV: &str = "vb";
const PREFIX_LEN: u32 = 24;
/// The routing tables that send each end's address out of the other end.
const TABLE_TO_RECEIVER: u32 = 100;
const TABLE_TO_SENDER: u32 = 101;

/// The veth MTU by default: rxe's active MTU is then 4096 (rxe takes 80
/// bytes of headers off the netdev MTU and rounds down to an IB MTU).
pub(crate) const DEFAULT_MTU: u32 = 4200;
/// The MTUs `--link-mtu` takes: from the smallest that leaves rxe an IB
/// MTU (256) to jumbo frames (tbf's burst follows the MTU).
const MTU_RANGE: std::ops::RangeInclusive<u32> = 576..=9000;
/// Bytes a packet takes in tbf's bucket beyond the MTU (the Ethernet
/// header, with room to spare).
const TBF_HEADROOM: u32 = 64;
/// tbf's bucket holds this many packets. tbf sends a packet when its
/// bucket has the tokens and otherwise sleeps on a timer; under emulation
/// the timer fires late, and with a bucket of one packet the time it is
/// late is lost for good (one unmodified bulk sender moved 74% of the
/// rate). With two, the link catches up after a late timer (90% and more)
/// and lets at most two packets out back to back: a packet behind a queue
/// still waits for all of it, as at a NIC port.
const TBF_BUCKET_PACKETS: u32 = 2;
/// The real-time priority of the kernel threads that run deferred softirq
/// work (`ksoftirqd`). rxe does a NIC's work in softirqs (its requester,
/// responder and completer, and tbf's timer), and a busy CPU hands that
/// work to these threads; at the default priority they wait behind tenant
/// processes for whole scheduler slices (a latency request then stalls for
/// 10 to 20 ms with the link idle), which no NIC does. At this priority
/// the emulated NIC is not starved by the processes that use it.
const SOFTIRQ_THREAD_PRIORITY: u32 = 50;
/// tbf's queue: large, so packets wait rather than drop (rxe's go-back-N
/// after a drop is far slower than any queue here).
const TBF_LIMIT: &str = "16mb";
/// The slowest and fastest rates `--link` takes. Below 1 Mbit/s one 4 KiB
/// packet takes longer than 30 ms, close to RC's retry timeout.
const MIN_BPS: u64 = 1_000_000;
const MAX_BPS: u64 = 1_000_000_000_000;

/// The rate `cargo xtask test` boots the device tests' link at, and the
/// most it shapes it to: the job first shapes it to half of what rxe
/// carries unshaped in that boot, if that is less
/// ([`Link::calibration_script`]).
pub(crate) const TEST_RATE: &str = "200mbit";

/// How fast the link is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rate {
    /// No qdisc: the veth's own receive backlog is the only queue.
    Unshaped,
    /// A tbf qdisc on each end at this many bits per second.
    Bits(u64),
}

/// The link `--link` asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Link {
    /// RATE as the user wrote it (exported as `MTRDMA_LINK_RATE`).
    pub(crate) rate_text: String,
    pub(crate) rate: Rate,
    /// The veth pair's MTU.
    pub(crate) mtu: u32,
}

impl Link {
    /// A link at RATE (`200mbit`, `1gbit`, `unshaped`) with the default MTU.
    pub(crate) fn new(rate: &str) -> Result<Link> {
        Ok(Link {
            rate_text: rate.to_string(),
            rate: parse_rate(rate)?,
            mtu: DEFAULT_MTU,
        })
    }

    /// The same link with the veth MTU given to `--link-mtu`.
    pub(crate) fn with_mtu(mut self, mtu: &str) -> Result<Link> {
        self.mtu = parse_mtu(mtu)?;
        Ok(self)
    }

    /// Bits per second, 0 for an unshaped link.
    pub(crate) fn bits_per_second(&self) -> u64 {
        match self.rate {
            Rate::Unshaped => 0,
            Rate::Bits(bps) => bps,
        }
    }

    /// What the job finds in its environment.
    pub(crate) fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("MTRDMA_LINK_SENDER", SENDER.to_string()),
            ("MTRDMA_LINK_RECEIVER", RECEIVER.to_string()),
            ("MTRDMA_LINK_SENDER_IP", SENDER_IP.to_string()),
            ("MTRDMA_LINK_RECEIVER_IP", RECEIVER_IP.to_string()),
            ("MTRDMA_LINK_RATE", self.rate_text.clone()),
            ("MTRDMA_LINK_RATE_BPS", self.bits_per_second().to_string()),
        ]
    }

    /// The guest's setup commands, one `step WHAT COMMAND...` per line
    /// (`step` runs the command and, if it fails, reports WHAT and the
    /// command's output and ends the job with 125), ending with a
    /// `wait_active DEVICE` for each device.
    pub(crate) fn setup_script(&self) -> String {
        let (a, b) = (SENDER_NETDEV, RECEIVER_NETDEV);
        let (ip_a, ip_b) = (SENDER_IP, RECEIVER_IP);
        let mtu = self.mtu;
        let mut s = String::from("# the shared bottleneck link (--link)\n");
        let mut step = |what: &str, cmd: &str| {
            s.push_str(&format!("step {} {cmd}\n", proc::shell_quote(what)));
        };
        step(
            "link: create the veth pair",
            &format!("ip link add {a} type veth peer name {b}"),
        );
        for (dev, ip) in [(a, ip_a), (b, ip_b)] {
            step(
                &format!("link: set MTU {mtu} on {dev}"),
                &format!("ip link set {dev} mtu {mtu}"),
            );
            step(
                &format!("link: add {ip} to {dev}"),
                &format!("ip addr add {ip}/{PREFIX_LEN} dev {dev}"),
            );
        }
        for dev in [a, b] {
            step(
                &format!("link: bring {dev} up"),
                &format!("ip link set {dev} up"),
            );
        }
        for dev in ["all", a, b] {
            for (key, value) in [("accept_local", 1), ("rp_filter", 0)] {
                let key = format!("net.ipv4.conf.{dev}.{key}");
                step(
                    &format!("link: sysctl {key}"),
                    &format!("sysctl -q -w {key}={value}"),
                );
            }
        }
        for (dev, peer, peer_ip) in [(a, b, ip_b), (b, a, ip_a)] {
            step(
                &format!("link: static neighbour {peer_ip} on {dev}"),
                &format!(
                    "ip neigh replace {peer_ip} lladdr \"$(cat /sys/class/net/{peer}/address)\" \
                     dev {dev} nud permanent"
                ),
            );
        }
        for (table, to, dev, src) in [
            (TABLE_TO_RECEIVER, ip_b, a, ip_a),
            (TABLE_TO_SENDER, ip_a, b, ip_b),
        ] {
            step(
                &format!("link: rule sending local traffic for {to} out of {dev}"),
                &format!("ip rule add pref 10 iif lo to {to} lookup {table}"),
            );
            step(
                &format!("link: route to {to} out of {dev} (table {table})"),
                &format!("ip route add {to} dev {dev} src {src} table {table}"),
            );
        }
        step(
            "link: move the local table behind the link's rules",
            "ip rule add pref 1000 lookup local",
        );
        step(
            "link: remove the local table's first rule",
            "ip rule del pref 0",
        );
        for (rdma, dev) in [(SENDER, a), (RECEIVER, b)] {
            step(
                &format!("link: rdma link add {rdma}"),
                &format!("rdma link add {rdma} type rxe netdev {dev}"),
            );
        }
        if let Rate::Bits(bps) = self.rate {
            for dev in [a, b] {
                step(
                    &format!("link: tbf qdisc at {} on {dev}", self.rate_text),
                    &self.tbf_command(dev, &bps.to_string()),
                );
            }
        }
        step(
            "link: real-time priority for the softirq threads (rxe's NIC work)",
            &format!(
                "sh -c 'for p in $(pgrep -x \"ksoftirqd/[0-9]+\"); do \
                 chrt -f -p {SOFTIRQ_THREAD_PRIORITY} \"$p\" || exit 1; done'"
            ),
        );
        for rdma in [SENDER, RECEIVER] {
            s.push_str(&format!("wait_active {rdma}\n"));
        }
        s
    }
}

impl Link {
    /// The command that shapes `dev` to `bps` bits per second (a number or
    /// a shell expression that gives one).
    fn tbf_command(&self, dev: &str, bps: &str) -> String {
        format!(
            "tc qdisc add dev {dev} root tbf rate {bps}bit burst {burst} limit {TBF_LIMIT}",
            burst = (self.mtu + TBF_HEADROOM) * TBF_BUCKET_PACKETS
        )
    }

    /// Guest commands that measure what rxe carries across the link with
    /// no shaping in this boot, then shape both ends to a rate chosen from
    /// it and export that rate as `MTRDMA_LINK_RATE_BPS` and
    /// `MTRDMA_LINK_RATE` for what follows.
    ///
    /// The measurement: the qdiscs come off, one `perf` (the binary at
    /// `perf`) sends 1 MiB WRITEs from `rxa` to `rxb` for
    /// [`CALIBRATION_SECS`] on the plain path, and its average is the
    /// unshaped rate. With `fixed` given, the link is shaped to it (with a warning on stderr when it is more
    /// than half the unshaped rate); without, to half the unshaped rate
    /// rounded down to 10 Mbit/s, at most `ceiling` bits per second and at
    /// least 10 Mbit/s. Under emulation the host's speed sets what rxe
    /// carries (twice as much on one machine as on another), and a link
    /// faster than half of it is not the bottleneck: the tenants' CPU is.
    /// One line saying what was measured and chosen goes to stdout and to
    /// `report`.
    pub(crate) fn calibration_script(
        &self,
        perf: &str,
        fixed: Option<u64>,
        ceiling: u64,
        report: &str,
    ) -> String {
        let (a, b) = (SENDER_NETDEV, RECEIVER_NETDEV);
        let port = CALIBRATION_PORT;
        format!(
            "# the link's rate from what rxe carries unshaped in this boot\n\
             tc qdisc del dev {a} root 2>/dev/null\n\
             tc qdisc del dev {b} root 2>/dev/null\n\
             {perf} --server --device {RECEIVER} -p {port} > \"$TMPDIR/calibration.server\" 2>&1 &\n\
             for i in $(seq 100); do grep -q \":$(printf %04X {port}) \" /proc/net/tcp && break; sleep 0.1; done\n\
             {perf} --connect 127.0.0.1 --device {SENDER} -p {port} --test write_bw -s 1048576 \
             -D {CALIBRATION_SECS} --path raw --wait --ack-timeout 20 > \"$TMPDIR/calibration.client\" 2>&1\n\
             wait\n\
             mbs=$(awk '/#bytes/ {{ getline; print $4; exit }}' \"$TMPDIR/calibration.client\")\n\
             if [ -z \"$mbs\" ]; then\n\
             echo 'link: measuring the unshaped rate failed:' >&2; cat \"$TMPDIR/calibration.client\" >&2; exit 125\n\
             fi\n\
             {shape}",
            shape = self.shape_from_measurement(fixed, ceiling, report),
        )
    }

    /// The second half of [`Link::calibration_script`]: from `$mbs`, the
    /// unshaped rate in MB/s (2^20 bytes), chooses the rate, shapes both
    /// ends, exports it and reports.
    fn shape_from_measurement(&self, fixed: Option<u64>, ceiling: u64, report: &str) -> String {
        let choose = match fixed {
            Some(bps) => format!(
                "rate={bps}\n\
                 if [ $((rate * 2)) -gt \"$unshaped\" ]; then\n\
                 echo \"link: warning: {bps} bit/s is more than half of what rxe carried unshaped ($unshaped bit/s): the tenants' CPU, not the link, may be the bottleneck\" >&2\n\
                 fi\n"
            ),
            None => format!(
                "rate=$(awk -v u=\"$unshaped\" 'BEGIN {{ r = u / 2; if (r > {ceiling}) r = {ceiling}; \
                 r = int(r / 10000000) * 10000000; if (r < 10000000) r = 10000000; printf \"%d\", r }}')\n"
            ),
        };
        format!(
            "unshaped=$(awk -v m=\"$mbs\" 'BEGIN {{ printf \"%d\", m * 1048576 * 8 }}')\n\
             if [ \"$unshaped\" -le 0 ]; then echo \"link: unshaped rate $mbs MB/s is not a rate\" >&2; exit 125; fi\n\
             {choose}\
             {tbf_a} || exit 125\n\
             {tbf_b} || exit 125\n\
             export MTRDMA_LINK_RATE_BPS=$rate MTRDMA_LINK_RATE=\"${{rate}}bit\"\n\
             echo \"link: rxe carried $mbs MB/s ($unshaped bit/s) from {SENDER} to {RECEIVER} unshaped in this boot; the link is shaped to $rate bit/s\" | tee {report}\n",
            tbf_a = self.tbf_command(SENDER_NETDEV, "${rate}"),
            tbf_b = self.tbf_command(RECEIVER_NETDEV, "${rate}"),
        )
    }
}

/// How long the unshaped rate is measured (see [`Link::calibration_script`]).
const CALIBRATION_SECS: u32 = 6;
/// The TCP port of the measurement's control connection.
const CALIBRATION_PORT: u32 = 17_999;

/// Parses `--link`'s RATE: a number with a unit in bits per second (`bit`,
/// `kbit`, `mbit`, `gbit`, `tbit`, or binary `kibit` .. `tibit`, any case,
/// as tc reads them), or `unshaped`.
pub(crate) fn parse_rate(text: &str) -> Result<Rate> {
    const EXAMPLE: &str = "e.g. 200mbit, 50mbit, 1gbit, or `unshaped`";
    if text.eq_ignore_ascii_case("unshaped") {
        return Ok(Rate::Unshaped);
    }
    let split = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    if number.is_empty() {
        bail!("--link {text:?}: RATE must start with a number ({EXAMPLE})");
    }
    let value: f64 = number
        .parse()
        .with_context(|| format!("--link {text:?}: {number:?} is not a number ({EXAMPLE})"))?;
    let unit = unit.to_ascii_lowercase();
    let scale: f64 = match unit.as_str() {
        "bit" => 1.0,
        "kbit" => 1e3,
        "mbit" => 1e6,
        "gbit" => 1e9,
        "tbit" => 1e12,
        "kibit" => 1024.0,
        "mibit" => 1024.0 * 1024.0,
        "gibit" => 1024.0 * 1024.0 * 1024.0,
        "tibit" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        "" => bail!("--link {text:?}: RATE needs a unit in bits per second ({EXAMPLE})"),
        u if u.ends_with("bps") => bail!(
            "--link {text:?}: tc reads {unit:?} as bytes per second; \
             give RATE in bits per second ({EXAMPLE})"
        ),
        _ => bail!("--link {text:?}: unknown unit {unit:?} ({EXAMPLE})"),
    };
    let bps = (value * scale).round();
    if bps < MIN_BPS as f64 {
        bail!(
            "--link {text:?}: below 1mbit one 4 KiB packet takes longer than RC's \
             retry timeout allows ({EXAMPLE})"
        );
    }
    if bps > MAX_BPS as f64 {
        bail!("--link {text:?}: above 1tbit, surely a typo ({EXAMPLE})");
    }
    // In range, so the conversion is exact enough and cannot overflow.
    Ok(Rate::Bits(bps as u64))
}

/// Parses `--link-mtu`: the veth pair's MTU in bytes.
pub(crate) fn parse_mtu(text: &str) -> Result<u32> {
    let mtu: u32 = text
        .parse()
        .with_context(|| format!("--link-mtu {text:?}: give the veth MTU in bytes, e.g. 1500"))?;
    if !MTU_RANGE.contains(&mtu) {
        bail!(
            "--link-mtu {mtu}: the veth MTU must be {} to {} bytes \
             (4200 gives rxe active MTU 4096, 1500 gives 1024)",
            MTU_RANGE.start(),
            MTU_RANGE.end()
        );
    }
    Ok(mtu)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_rates_in_bits_per_second() {
        for (text, bps) in [
            ("200mbit", 200_000_000),
            ("50mbit", 50_000_000),
            ("1gbit", 1_000_000_000),
            ("1.5gbit", 1_500_000_000),
            ("200Mbit", 200_000_000),
            ("2500kbit", 2_500_000),
            ("1000000bit", 1_000_000),
            ("1mibit", 1_048_576),
            ("1tbit", 1_000_000_000_000),
        ] {
            assert_eq!(parse_rate(text).unwrap(), Rate::Bits(bps), "{text}");
        }
        assert_eq!(parse_rate("unshaped").unwrap(), Rate::Unshaped);
        assert_eq!(parse_rate("UNSHAPED").unwrap(), Rate::Unshaped);
    }

    #[test]
    fn refuses_bad_rates_with_the_reason() {
        for (text, reason) in [
            ("", "must start with a number"),
            ("mbit", "must start with a number"),
            ("200", "needs a unit"),
            ("200mbps", "bytes per second"),
            ("25MBps", "bytes per second"),
            ("200mb", "unknown unit"),
            ("200 mbit", "unknown unit"),
            ("1e3mbit", "unknown unit"),
            ("-5mbit", "must start with a number"),
            ("1.2.3mbit", "is not a number"),
            (".", "is not a number"),
            ("0mbit", "below 1mbit"),
            ("999kbit", "below 1mbit"),
            ("2tbit", "above 1tbit"),
            ("fast", "must start with a number"),
        ] {
            let err = parse_rate(text).unwrap_err().to_string();
            assert!(err.contains(reason), "{text:?}: {err}");
            assert!(err.contains("200mbit"), "{text:?} gives an example: {err}");
        }
    }

    #[test]
    fn parses_mtus_in_range() {
        assert_eq!(parse_mtu("1500").unwrap(), 1500);
        assert_eq!(parse_mtu("9000").unwrap(), 9000);
        assert_eq!(parse_mtu("576").unwrap(), 576);
        for bad in ["575", "9001", "0", "1500b", "", "-1"] {
            assert!(parse_mtu(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn exports_the_devices_addresses_and_rate() {
        let link = Link::new("200mbit").unwrap();
        let env: std::collections::HashMap<_, _> = link.env().into_iter().collect();
        assert_eq!(env["MTRDMA_LINK_SENDER"], "rxa");
        assert_eq!(env["MTRDMA_LINK_RECEIVER"], "rxb");
        assert_eq!(env["MTRDMA_LINK_SENDER_IP"], "192.168.77.1");
        assert_eq!(env["MTRDMA_LINK_RECEIVER_IP"], "192.168.77.2");
        assert_eq!(env["MTRDMA_LINK_RATE"], "200mbit");
        assert_eq!(env["MTRDMA_LINK_RATE_BPS"], "200000000");
        let unshaped = Link::new("unshaped").unwrap();
        let env: std::collections::HashMap<_, _> = unshaped.env().into_iter().collect();
        assert_eq!(env["MTRDMA_LINK_RATE"], "unshaped");
        assert_eq!(env["MTRDMA_LINK_RATE_BPS"], "0");
        assert_eq!(Link::new(TEST_RATE).unwrap().bits_per_second(), 200_000_000);
    }

    /// Runs the choice of rate from a measured `mbs` with a `tc` that only
    /// records its arguments; returns the exported rate, what `tc` was
    /// asked and what went to stderr.
    fn choose(link: &Link, mbs: &str, fixed: Option<u64>) -> (String, String, String) {
        let dir = std::env::temp_dir().join(format!(
            "mtrdma-link-choose-{}-{}",
            std::process::id(),
            mbs.replace('.', "_")
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let tc = dir.join("tc");
        std::fs::write(
            &tc,
            "#!/bin/sh\necho \"$@\" >> \"$(dirname \"$0\")/calls\"\n",
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&tc, std::fs::Permissions::from_mode(0o755)).unwrap();
        let report = dir.join("report");
        let script = format!(
            "mbs={mbs}\n{}echo \"$MTRDMA_LINK_RATE_BPS $MTRDMA_LINK_RATE\"",
            link.shape_from_measurement(fixed, 200_000_000, &report.display().to_string())
        );
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(&script)
            .env("PATH", format!("{}:/usr/bin:/bin", dir.display()))
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let stdout = String::from_utf8(out.stdout).unwrap();
        let calls = std::fs::read_to_string(dir.join("calls")).unwrap_or_default();
        assert!(std::fs::read_to_string(&report)
            .unwrap()
            .contains("unshaped"));
        let _ = std::fs::remove_dir_all(&dir);
        (
            stdout.lines().last().unwrap_or("").to_string(),
            calls,
            String::from_utf8(out.stderr).unwrap(),
        )
    }

    #[test]
    fn shapes_to_half_the_unshaped_rate_within_the_ceiling() {
        let link = Link::new("200mbit").unwrap();
        // 22.25 MB/s unshaped is 186.6 Mbit/s: half, rounded down, is 90.
        let (rate, calls, _) = choose(&link, "22.25", None);
        assert_eq!(rate, "90000000 90000000bit");
        for dev in ["va", "vb"] {
            assert!(
                calls.contains(&format!(
                    "qdisc add dev {dev} root tbf rate 90000000bit burst 8528 limit 16mb"
                )),
                "{calls}"
            );
        }
        // A fast host: the ceiling.
        assert_eq!(choose(&link, "120", None).0, "200000000 200000000bit");
        // A very slow one: never under 10 Mbit/s.
        assert_eq!(choose(&link, "0.5", None).0, "10000000 10000000bit");
        // A rate asked for is kept, with a warning when it is too fast.
        let (rate, _, warned) = choose(&link, "22.25", Some(150_000_000));
        assert_eq!(rate, "150000000 150000000bit");
        assert!(warned.contains("more than half"), "{warned}");
        let (_, _, quiet) = choose(&link, "22.25", Some(50_000_000));
        assert!(quiet.is_empty(), "{quiet}");
    }

    #[test]
    fn shapes_both_ends_or_neither() {
        let script = Link::new("50mbit").unwrap().setup_script();
        for dev in ["va", "vb"] {
            assert!(
                script.contains(&format!(
                    "tc qdisc add dev {dev} root tbf rate 50000000bit burst 8528 limit 16mb"
                )),
                "{script}"
            );
            assert!(script.contains(&format!("ip link set {dev} mtu 4200")));
        }
        assert!(script.contains("rdma link add rxa type rxe netdev va"));
        assert!(script.contains("rdma link add rxb type rxe netdev vb"));
        assert!(script.contains("ip addr add 192.168.77.1/24 dev va"));
        assert!(script.contains("ip addr add 192.168.77.2/24 dev vb"));
        assert!(script.contains("chrt -f -p 50"), "{script}");
        assert!(script.ends_with("wait_active rxa\nwait_active rxb\n"));
        // The local table leaves pref 0 only after its new rule exists.
        let add = script.find("ip rule add pref 1000 lookup local").unwrap();
        assert!(add < script.find("ip rule del pref 0").unwrap());
        // Every command is a checked step.
        for line in script.lines().filter(|l| !l.starts_with('#')) {
            assert!(
                line.starts_with("step 'link: ") || line.starts_with("wait_active "),
                "{line}"
            );
        }

        let unshaped = Link::new("unshaped")
            .unwrap()
            .with_mtu("1500")
            .unwrap()
            .setup_script();
        assert!(!unshaped.contains("tc qdisc"), "{unshaped}");
        assert!(unshaped.contains("ip link set vb mtu 1500"));
    }
}
