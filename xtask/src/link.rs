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
//!
//! The demo and the test command's boot then choose the rate in the job
//! itself ([`Link::calibration_script`]): what rxe carries across the
//! link unshaped is measured and reported, and the link is shaped to the
//! highest rate, in steps of 10 Mbit/s, at which perftest's
//! `ib_write_bw -s 4096` alone fills at least 95% of it in that boot,
//! found by a binary search with every probe printed ([`Search`]); or to
//! a rate given.

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
/// The CPU that takes every packet each end of the veth receives (Receive
/// Packet Steering with a one-CPU mask). A veth hands a packet to the
/// receive backlog of the CPU that sent it, and tbf sends from whichever
/// CPU its timer or the next enqueue runs on, so with two CPUs packets
/// arrived out of order. rxe takes that for loss: the receiver NAKs, the
/// sender goes back N, and when the last packets of a burst were the late
/// ones, nothing is NAKed and the queue pair waits out its ACK timeout
/// (seconds for the bulk tenants: 4.3 s at `--ack-timeout 20`) with the
/// link idle. A latency probe then measured an idle link next to
/// "unprotected" bulk tenants (p99 0.6 ms instead of 13 to 35 ms). A wire
/// delivers in order; on one CPU's backlog so does the veth (measured: 53
/// to 80 sequence NAKs and 5 timeouts per 8 s of two bulk tenants before,
/// none after).
const RECEIVE_CPU: u32 = 0;
/// tbf's queue: large, so packets wait rather than drop (rxe's go-back-N
/// after a drop is far slower than any queue here).
const TBF_LIMIT: &str = "16mb";
/// The slowest and fastest rates `--link` takes. Below 1 Mbit/s one 4 KiB
/// packet takes longer than 30 ms, close to RC's retry timeout.
const MIN_BPS: u64 = 1_000_000;
const MAX_BPS: u64 = 1_000_000_000_000;

/// The rate `cargo xtask test` boots the device tests' link at, and the
/// most it shapes it to: the job first shapes it to the highest rate at
/// which `ib_write_bw -s 4096` fills it in that boot, if that is less
/// ([`Link::calibration_script`], with the short probes).
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
        for dev in [a, b] {
            step(
                &format!("link: {dev} receives its packets in order (RPS to CPU {RECEIVE_CPU})"),
                &format!(
                    "sh -c 'echo {mask:x} > /sys/class/net/{dev}/queues/rx-0/rps_cpus'",
                    mask = 1u64 << RECEIVE_CPU
                ),
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
    /// no shaping in this boot, then shape both ends to a rate chosen as
    /// `choice` says and export that rate as `MTRDMA_LINK_RATE_BPS` and
    /// `MTRDMA_LINK_RATE` for what follows.
    ///
    /// The measurement: the qdiscs come off, one `perf` (the binary at
    /// `perf`) sends 1 MiB WRITEs from `rxa` to `rxb` for
    /// [`CALIBRATION_SECS`] on the plain path, and its average is the
    /// unshaped rate. [`RateChoice::Fixed`] shapes the link to that rate
    /// (with a warning on stderr when it is more than half the unshaped
    /// rate); [`RateChoice::Search`] shapes it to the highest rate at which
    /// perftest's `ib_write_bw -s 4096` alone fills at least
    /// [`FILL_PERCENT`]% of it (see [`Search`]). What was measured, every
    /// probe and the rate chosen go to stdout and to `report` (a shell
    /// word), which starts afresh. The job ends with 125, saying why,
    /// when a measurement fails.
    pub(crate) fn calibration_script(
        &self,
        perf: &str,
        choice: RateChoice,
        report: &str,
    ) -> String {
        let (a, b) = (SENDER_NETDEV, RECEIVER_NETDEV);
        let port = CALIBRATION_PORT;
        let probe = match choice {
            RateChoice::Fixed(_) => String::new(),
            RateChoice::Search(search) => self.probe_function(search.probe_secs),
        };
        format!(
            "# the link's rate, from what rxe carries across it in this boot\n\
             tc qdisc del dev {a} root 2>/dev/null\n\
             tc qdisc del dev {b} root 2>/dev/null\n\
             {perf} --server --device {RECEIVER} -p {port} > \"$TMPDIR/calibration.server\" 2>&1 &\n\
             {listening}\n\
             {perf} --connect 127.0.0.1 --device {SENDER} -p {port} --test write_bw -s 1048576 \
             -D {CALIBRATION_SECS} --path raw --wait --ack-timeout 20 > \"$TMPDIR/calibration.client\" 2>&1\n\
             wait\n\
             mbs=$(awk '/#bytes/ {{ getline; print $4; exit }}' \"$TMPDIR/calibration.client\")\n\
             if [ -z \"$mbs\" ]; then\n\
             echo 'link: measuring the unshaped rate failed:' >&2; cat \"$TMPDIR/calibration.client\" >&2; exit 125\n\
             fi\n\
             {probe}\
             {shape}",
            shape = self.shape_from_measurement(choice, report),
            listening = proc::wait_listening_sh(port, 100),
        )
    }

    /// `link_shape`, a shell function that shapes both ends to `$rate`
    /// bits per second, replacing what shaped them before.
    fn shape_function(&self) -> String {
        let (a, b) = (SENDER_NETDEV, RECEIVER_NETDEV);
        format!(
            "link_shape() {{\n\
             tc qdisc del dev {a} root 2>/dev/null\n\
             tc qdisc del dev {b} root 2>/dev/null\n\
             {tbf_a} || {{ echo \"link: shaping {a} to $rate bit/s failed\" >&2; exit 125; }}\n\
             {tbf_b} || {{ echo \"link: shaping {b} to $rate bit/s failed\" >&2; exit 125; }}\n\
             }}\n",
            tbf_a = self.tbf_command(a, "${rate}"),
            tbf_b = self.tbf_command(b, "${rate}"),
        )
    }

    /// `link_probe RATE`, a shell function that shapes both ends to RATE
    /// and runs perftest's `ib_write_bw -s 4096` (its defaults otherwise,
    /// `-D secs`) from `rxa` to `rxb` across the link, alone, and sets
    /// `moved` to its BW average in MB/s (2^20 bytes). When ib_write_bw
    /// fails or prints no result (under emulation perftest now and then
    /// cannot calibrate its clock) it runs once more; after a second
    /// failure the job ends with 125, with both outputs on stderr.
    fn probe_function(&self, secs: u32) -> String {
        let port = PROBE_PORT;
        let tool = format!("ib_write_bw -x 1 -s {PROBE_SIZE} -D {secs} -p {port}");
        format!(
            "link_probe() {{\n\
             rate=$1\n\
             link_shape\n\
             for try in 1 2; do\n\
             {tool} -d {RECEIVER} > \"$TMPDIR/link-probe.server\" 2>&1 &\n\
             server=$!\n\
             # until the server listens (state 0A: an earlier probe's closed\n\
             # connection on the port does not count)\n\
             {listening}\n\
             {tool} -d {SENDER} 127.0.0.1 > \"$TMPDIR/link-probe.client\" 2>&1; rc=$?\n\
             [ $rc -eq 0 ] || kill $server 2>/dev/null\n\
             wait $server\n\
             moved=$(awk '/#bytes/ {{ getline; print $4; exit }}' \"$TMPDIR/link-probe.client\")\n\
             case $moved in ''|*[!0-9.]*) moved= ;; esac\n\
             if [ $rc -eq 0 ] && [ -n \"$moved\" ]; then return 0; fi\n\
             echo \"link: ib_write_bw -s {PROBE_SIZE} across the link at $rate bit/s gave no result (exit status $rc, try $try of 2); its output, then its server's:\" >&2\n\
             cat \"$TMPDIR/link-probe.client\" \"$TMPDIR/link-probe.server\" >&2\n\
             done\n\
             echo \"link: ib_write_bw failed twice at $rate bit/s: cannot find the rate it fills; stopping\" >&2\n\
             exit 125\n\
             }}\n",
            listening = proc::wait_listening_sh(port, 100),
        )
    }

    /// The second half of [`Link::calibration_script`]: from `$mbs`, the
    /// unshaped rate in MB/s (2^20 bytes), chooses the rate (for a search,
    /// with `link_probe` from [`Link::probe_function`]), shapes both ends,
    /// exports it and reports.
    fn shape_from_measurement(&self, choice: RateChoice, report: &str) -> String {
        let mut s = format!(
            "{shape}\
             : > {report}\n\
             unshaped=$(awk -v m=\"$mbs\" 'BEGIN {{ printf \"%d\", m * 1048576 * 8 }}')\n\
             if [ \"$unshaped\" -le 0 ]; then echo \"link: unshaped rate $mbs MB/s is not a rate\" >&2; exit 125; fi\n",
            shape = self.shape_function(),
        );
        match choice {
            RateChoice::Fixed(bps) => s.push_str(&format!(
                "rate={bps}\n\
                 if [ $((rate * 2)) -gt \"$unshaped\" ]; then\n\
                 echo \"link: warning: {bps} bit/s is more than half of what rxe carried unshaped ($unshaped bit/s): the tenants' CPU, not the link, may be the bottleneck\" >&2\n\
                 fi\n\
                 link_shape\n\
                 echo \"link: rxe carried $mbs MB/s ($unshaped bit/s) from {SENDER} to {RECEIVER} unshaped in this boot; the link is shaped to $rate bit/s\" | tee -a {report}\n"
            )),
            RateChoice::Search(search) => s.push_str(&search.script(report)),
        }
        s.push_str("export MTRDMA_LINK_RATE_BPS=$rate MTRDMA_LINK_RATE=\"${rate}bit\"\n");
        s
    }
}

/// How [`Link::calibration_script`] chooses the link's rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RateChoice {
    /// `--link RATE`: this many bits per second.
    Fixed(u64),
    /// `--link auto`: the highest rate perftest's `ib_write_bw` fills.
    Search(Search),
}

/// The search for the link's rate: the highest, in steps of
/// [`SEARCH_STEP_BPS`] from [`SEARCH_FLOOR_BPS`] up to `ceiling`, at
/// which perftest's `ib_write_bw -s 4096`, alone on the link, moves at
/// least [`FILL_PERCENT`]% of it in this boot. Under emulation the host's
/// speed, not the link, sets what one sender moves (`ib_write_bw` filled
/// 95 to 97% of 200 Mbit/s in some boots on one machine and 77 to 89% in
/// others), and a link the senders cannot fill is not the bottleneck the
/// demo's tenants share: their CPU is.
///
/// What `perf` carried unshaped before does not cap the search: it is
/// another sender (1 MiB WRITEs, waiting on completion events), and
/// `ib_write_bw` moved more than it across the shaped link in the same
/// boot (13.67 MB/s at 150 Mbit/s against 12.39 MB/s unshaped), or
/// filled 95.4% of 190 Mbit/s when it had carried 193.7 Mbit/s.
///
/// A binary search: a rate filled to the mark raises the lower end, one
/// short of it lowers the upper end, one probe each (six at most from 50
/// to 400 Mbit/s, each taking 3 s or more beyond its `-D`). A probe can
/// fall short of the link through a stall of the emulated CPU but never
/// run over it, so noise can only make the choice lower, where the link
/// is surely the bottleneck. The floor: rxe keeps about 64 packets of a
/// queue pair in flight, 43 ms at 50 Mbit/s, two thirds of perftest's
/// default RC retry timeout (67 ms); slower links queue nearer to it.
/// When no rate is filled to the mark, the link is shaped to the one
/// probed that was filled the most (where the link comes closest to
/// being the bottleneck), with a warning: not always the floor, since
/// on a loaded host `ib_write_bw` filled less of 50 Mbit/s than of 60
/// or 70 in some boots (82.9 against 85.6%, 87.2 against 92.0%; no
/// retransmission counted).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Search {
    /// The fastest rate tried.
    pub(crate) ceiling: u64,
    /// How long each probe's `ib_write_bw` runs (`-D`).
    pub(crate) probe_secs: u32,
}

/// The share of the link `ib_write_bw` must fill at the rate the search
/// chooses.
const FILL_PERCENT: u32 = 95;
/// The slowest rate the search tries.
const SEARCH_FLOOR_BPS: u64 = 50_000_000;
/// The search's resolution.
const SEARCH_STEP_BPS: u64 = 10_000_000;
/// How long a probe runs: long enough that one stall of the emulated CPU
/// does not decide it.
const PROBE_SECS: u32 = 3;
/// How long a probe runs in the short forms (`cargo xtask demo --short`,
/// the test command's boot): the search still runs, less surely. Not 1:
/// on a quiet host 1-second probes filled 91.6 to 93.7% of 50 to
/// 130 Mbit/s, while 3-second ones filled 95.3 to 96.5% of 130 to
/// 180 Mbit/s in the next boot. Most likely ib_write_bw's time includes
/// filling the queue in front of the link (about 64 packets, 27 ms at
/// 80 Mbit/s), which takes 2.7% off a 1-second probe's share.
const SHORT_PROBE_SECS: u32 = 2;
/// The probes' message size.
const PROBE_SIZE: u32 = 4096;
/// The TCP port of the probes' control connection.
const PROBE_PORT: u32 = 17_998;

impl Search {
    /// A search up to `ceiling` bits per second, with short probes for the
    /// short forms.
    pub(crate) fn new(ceiling: u64, short: bool) -> Search {
        Search {
            ceiling,
            probe_secs: if short { SHORT_PROBE_SECS } else { PROBE_SECS },
        }
    }

    /// The search as guest commands, after `$mbs` and `$unshaped` are
    /// known and with `link_probe` defined: sets `rate`, shapes both ends to it and
    /// reports to stdout and `report`.
    fn script(&self, report: &str) -> String {
        let step = SEARCH_STEP_BPS;
        let floor = SEARCH_FLOOR_BPS.div_ceil(step);
        let ceiling = (self.ceiling / step).max(floor);
        let fill = FILL_PERCENT;
        let secs = self.probe_secs;
        format!(
            "# the highest rate, in steps of {step} bit/s, that ib_write_bw -s {PROBE_SIZE} fills to {fill}%\n\
             lo={floor}; hi={ceiling}\n\
             echo \"link: rxe carried $mbs MB/s ($unshaped bit/s) from {SENDER} to {RECEIVER} unshaped in this boot\" | tee -a {report}\n\
             echo \"link: searching $((lo * {step_m})) to $((hi * {step_m})) Mbit/s, in steps of {step_m}, for the highest rate at which ib_write_bw -s {PROBE_SIZE} alone fills at least {fill}% of the link ({secs} s a probe)\" | tee -a {report}\n\
             best=; probes=0; started=$(date +%s)\n\
             # the probe filled the largest share, for when none fills enough\n\
             most=; most_share=-1\n\
             while [ $lo -le $hi ]; do\n\
             mid=$(((lo + hi) / 2))\n\
             link_probe $((mid * {step}))\n\
             probes=$((probes + 1))\n\
             share=$(awk -v m=\"$moved\" -v r=\"$rate\" 'BEGIN {{ printf \"%.1f\", m * 1048576 * 8 * 100 / r }}')\n\
             if awk -v s=\"$share\" -v t=\"$most_share\" 'BEGIN {{ exit !(s > t) }}'; then most=$rate; most_share=$share; fi\n\
             if awk -v m=\"$moved\" -v r=\"$rate\" 'BEGIN {{ exit !(m * 1048576 * 8 * 100 >= {fill} * r) }}'; then\n\
             best=$mid; lo=$((mid + 1)); verdict=filled\n\
             else\n\
             hi=$((mid - 1)); verdict='short of {fill}%'\n\
             fi\n\
             echo \"link: probe at $((rate / 1000000)) Mbit/s: ib_write_bw moved $moved MB/s, $share% of the link: $verdict\" | tee -a {report}\n\
             done\n\
             took=$(($(date +%s) - started))\n\
             if [ -n \"$best\" ]; then\n\
             rate=$((best * {step}))\n\
             echo \"link: the link is shaped to $rate bit/s ($((rate / 1000000)) Mbit/s), the highest rate at which ib_write_bw -s {PROBE_SIZE} alone filled at least {fill}% of it in this boot ($probes probes, $took s)\" | tee -a {report}\n\
             else\n\
             rate=$most\n\
             echo \"link: warning: ib_write_bw -s {PROBE_SIZE} alone filled less than {fill}% of the link at every rate tried, down to $((lo * {step_m})) Mbit/s: the link is shaped to the rate it filled the most of, $rate bit/s ($((rate / 1000000)) Mbit/s, $most_share%), where the tenants' CPU, not the link, may be the bottleneck ($probes probes, $took s)\" | tee -a {report} >&2\n\
             fi\n\
             link_shape\n",
            step_m = step / 1_000_000,
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

    /// A scratch directory with stand-ins for `tc` and `ib_write_bw`, for
    /// running the calibration's second half on the host.
    ///
    /// `tc` records its arguments in `tc.calls` and the rate of a qdisc it
    /// adds in `rate`. `ib_write_bw` records its arguments in
    /// `ib_write_bw.calls`; as a server it exits at once, as a client it
    /// prints perftest's result row for a sender that moves 97% of the
    /// link, or all of `capacity` bit/s if that is less (80% of the link
    /// below the rate in a file `slow_below`). With a file `fail`
    /// holding N, the first N clients fail without a result.
    struct Guest {
        dir: std::path::PathBuf,
    }

    impl Guest {
        fn new(name: &str, capacity: u64) -> Guest {
            let dir = std::env::temp_dir().join(format!(
                "mtrdma-link-{name}-{}-{capacity}",
                std::process::id()
            ));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            let tools = [
                (
                    "tc",
                    "#!/bin/sh\nd=$(dirname \"$0\")\necho \"$@\" >> \"$d/tc.calls\"\n\
                     while [ $# -gt 1 ]; do if [ \"$1\" = rate ]; then echo \"${2%bit}\" > \"$d/rate\"; fi; shift; done\n",
                ),
                (
                    "ib_write_bw",
                    "#!/bin/sh\nd=$(dirname \"$0\")\necho \"$@\" >> \"$d/ib_write_bw.calls\"\n\
                     case \" $* \" in *' 127.0.0.1 '*) ;; *) exit 0 ;; esac\n\
                     if [ -s \"$d/fail\" ] && [ \"$(cat \"$d/fail\")\" -gt 0 ]; then\n\
                     echo $(($(cat \"$d/fail\") - 1)) > \"$d/fail\"; echo ' Couldn'\\''t connect to 127.0.0.1:17998'; exit 1\n\
                     fi\n\
                     mbs=$(awk -v r=\"$(cat \"$d/rate\")\" -v c=\"$(cat \"$d/capacity\")\" \
                     -v s=\"$(cat \"$d/slow_below\" 2>/dev/null)\" \
                     'BEGIN { m = r * (r < s + 0 ? 0.8 : 0.97); if (m > c) m = c; printf \"%.2f\", m / 8 / 1048576 }')\n\
                     echo ' #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]'\n\
                     echo \" 4096       12800            0.00               $mbs  \t\t   0.004266\"\n",
                ),
                // The server is taken to listen at once.
                ("grep", "#!/bin/sh\nexit 0\n"),
            ];
            use std::os::unix::fs::PermissionsExt as _;
            for (name, text) in tools {
                let path = dir.join(name);
                std::fs::write(&path, text).unwrap();
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
            }
            std::fs::write(dir.join("capacity"), capacity.to_string()).unwrap();
            Guest { dir }
        }

        fn read(&self, name: &str) -> String {
            std::fs::read_to_string(self.dir.join(name)).unwrap_or_default()
        }

        /// Runs the choice of rate from a measured `mbs` (MB/s unshaped)
        /// and returns the exit status, the exported rate (the last line
        /// of stdout), stdout and stderr.
        /// [`Guest::choose`] by a search up to 400 Mbit/s on a link of
        /// 400 Mbit/s, which must succeed: what it printed and warned.
        fn searched(&self, mbs: &str) -> (String, String) {
            let link = Link::new("400mbit").unwrap();
            let (status, out, err) = self.choose(&link, mbs, search(400_000_000));
            assert_eq!(status, 0, "{out}{err}");
            (out, err)
        }

        fn choose(&self, link: &Link, mbs: &str, choice: RateChoice) -> (i32, String, String) {
            let report = self.dir.join("report");
            let probe = match choice {
                RateChoice::Search(search) => link.probe_function(search.probe_secs),
                RateChoice::Fixed(_) => String::new(),
            };
            let script = format!(
                "mbs={mbs}\n{probe}{}echo \"$MTRDMA_LINK_RATE_BPS $MTRDMA_LINK_RATE\"",
                link.shape_from_measurement(choice, &report.display().to_string())
            );
            let out = std::process::Command::new("sh")
                .arg("-c")
                .arg(&script)
                .env("PATH", format!("{}:/usr/bin:/bin", self.dir.display()))
                .env("TMPDIR", &self.dir)
                .output()
                .unwrap();
            let stdout = String::from_utf8(out.stdout).unwrap();
            (
                out.status.code().unwrap_or(-1),
                stdout,
                String::from_utf8(out.stderr).unwrap(),
            )
        }
    }

    impl Drop for Guest {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    fn exported(stdout: &str) -> &str {
        stdout.lines().last().unwrap_or("")
    }

    fn search(ceiling: u64) -> RateChoice {
        RateChoice::Search(Search::new(ceiling, false))
    }

    #[test]
    fn finds_the_highest_rate_ib_write_bw_fills() {
        // A sender that moves at most 160 Mbit/s fills 95% of links up to
        // 168 Mbit/s: on the 10 Mbit/s grid, 160.
        let guest = Guest::new("search", 160_000_000);
        let (out, _) = guest.searched("74.82");
        assert_eq!(exported(&out), "160000000 160000000bit", "{out}");
        // A binary search from 50 to 400 Mbit/s, the first probe in the
        // middle, each printed with what ib_write_bw moved and its share.
        let probes: Vec<&str> = out
            .lines()
            .filter(|l| l.starts_with("link: probe at "))
            .collect();
        assert_eq!(
            probes,
            [
                "link: probe at 220 Mbit/s: ib_write_bw moved 19.07 MB/s, 72.7% of the link: short of 95%",
                "link: probe at 130 Mbit/s: ib_write_bw moved 15.03 MB/s, 97.0% of the link: filled",
                "link: probe at 170 Mbit/s: ib_write_bw moved 19.07 MB/s, 94.1% of the link: short of 95%",
                "link: probe at 150 Mbit/s: ib_write_bw moved 17.34 MB/s, 97.0% of the link: filled",
                "link: probe at 160 Mbit/s: ib_write_bw moved 18.50 MB/s, 97.0% of the link: filled",
            ],
            "{out}"
        );
        assert!(out.contains("searching 50 to 400 Mbit/s"), "{out}");
        assert!(
            out.contains(
                "the link is shaped to 160000000 bit/s (160 Mbit/s), the highest rate at which \
                 ib_write_bw -s 4096 alone filled at least 95% of it in this boot (5 probes, "
            ),
            "{out}"
        );
        // The unshaped rate, every probe and the choice are in the report.
        let report = guest.read("report");
        assert!(
            report.starts_with("link: rxe carried 74.82 MB/s"),
            "{report}"
        );
        for probe in probes {
            assert!(report.contains(probe), "{report}");
        }
        assert!(report.contains("shaped to 160000000 bit/s"), "{report}");
        // Each probe ran perftest's defaults but for the size, the GID
        // index and the duration, across the link, server on rxb.
        let calls = guest.read("ib_write_bw.calls");
        assert_eq!(
            calls.matches("-x 1 -s 4096 -D 3 -p 17998 -d rxb\n").count(),
            5,
            "{calls}"
        );
        assert_eq!(
            calls
                .matches("-x 1 -s 4096 -D 3 -p 17998 -d rxa 127.0.0.1\n")
                .count(),
            5,
            "{calls}"
        );
        // Both ends were reshaped for each probe, and last to the choice.
        let tc = guest.read("tc.calls");
        for dev in ["va", "vb"] {
            assert_eq!(tc.matches(&format!("qdisc del dev {dev} root")).count(), 6);
            assert!(tc.contains(&format!(
                "qdisc add dev {dev} root tbf rate 220000000bit burst 8528 limit 16mb"
            )));
        }
        assert!(
            tc.ends_with(
                "qdisc del dev va root\n\
                 qdisc del dev vb root\n\
                 qdisc add dev va root tbf rate 160000000bit burst 8528 limit 16mb\n\
                 qdisc add dev vb root tbf rate 160000000bit burst 8528 limit 16mb\n"
            ),
            "{tc}"
        );
    }

    #[test]
    fn the_search_spans_floor_to_ceiling_whatever_perf_carried() {
        // perf's 10 MB/s unshaped (83.9 Mbit/s) does not stop the search:
        // ib_write_bw fills the ceiling.
        let guest = Guest::new("uncapped", 1_000_000_000);
        let (out, _) = guest.searched("10");
        assert!(out.contains("searching 50 to 400 Mbit/s"), "{out}");
        assert_eq!(exported(&out), "400000000 400000000bit", "{out}");
        // The test command's ceiling is its rate, and short probes.
        let guest = Guest::new("short", 1_000_000_000);
        let choice = RateChoice::Search(Search::new(200_000_000, true));
        let link = Link::new("400mbit").unwrap();
        let (status, out, err) = guest.choose(&link, "74.82", choice);
        assert_eq!(status, 0, "{out}{err}");
        assert!(out.contains("searching 50 to 200 Mbit/s"), "{out}");
        assert!(out.contains("(2 s a probe)"), "{out}");
        assert_eq!(exported(&out), "200000000 200000000bit", "{out}");
        assert!(guest.read("ib_write_bw.calls").contains(" -D 2 "));
    }

    #[test]
    fn a_link_never_filled_is_shaped_to_the_rate_filled_most_with_a_warning() {
        // A sender too slow for every rate: the floor is filled the most.
        let guest = Guest::new("slow", 30_000_000);
        let (out, err) = guest.searched("74.82");
        assert_eq!(exported(&out), "50000000 50000000bit", "{out}");
        assert!(
            out.contains("link: probe at 50 Mbit/s: ib_write_bw moved 3.58 MB/s, 60.1%"),
            "{out}"
        );
        assert!(
            err.contains(
                "warning: ib_write_bw -s 4096 alone filled less than 95% of the link at every \
                 rate tried, down to 50 Mbit/s: the link is shaped to the rate it filled the \
                 most of, 50000000 bit/s (50 Mbit/s, 60.1%)"
            ),
            "{err}"
        );
        assert!(guest.read("report").contains("warning"));
        // Slow links that fill less (queues near RC's retry timeout with
        // perftest's default): the probe that came closest is kept.
        let guest = Guest::new("timeouts", 70_000_000);
        std::fs::write(guest.dir.join("slow_below"), "80000000").unwrap();
        let (out, err) = guest.searched("74.82");
        assert_eq!(exported(&out), "80000000 80000000bit", "{out}{err}");
        assert!(out.contains("probe at 60 Mbit/s"), "{out}");
        assert!(out.contains("probe at 50 Mbit/s"), "{out}");
        assert!(err.contains("80000000 bit/s (80 Mbit/s, 87.5%)"), "{err}");
    }

    #[test]
    fn a_probe_without_a_result_runs_again_then_stops_the_job() {
        // One failure: the probe runs again and the search goes on.
        let guest = Guest::new("flaky", 160_000_000);
        std::fs::write(guest.dir.join("fail"), "1").unwrap();
        let (out, err) = guest.searched("74.82");
        assert_eq!(exported(&out), "160000000 160000000bit", "{out}");
        assert!(
            err.contains("gave no result (exit status 1, try 1 of 2)"),
            "{err}"
        );
        assert!(err.contains("Couldn't connect"), "{err}");
        // Two in a row: the job ends with 125 and says why.
        let guest = Guest::new("broken", 160_000_000);
        std::fs::write(guest.dir.join("fail"), "2").unwrap();
        let link = Link::new("400mbit").unwrap();
        let (status, out, err) = guest.choose(&link, "74.82", search(400_000_000));
        assert_eq!(status, 125, "{out}{err}");
        assert!(
            err.contains("ib_write_bw failed twice at 220000000 bit/s"),
            "{err}"
        );
        assert!(!out.contains("MTRDMA"), "{out}");
    }

    #[test]
    fn a_fixed_rate_is_kept_with_a_warning_when_too_fast() {
        let guest = Guest::new("fixed", 1_000_000_000);
        let link = Link::new("200mbit").unwrap();
        // 22.25 MB/s unshaped is 186.6 Mbit/s: 150 is more than half.
        let (status, out, err) = guest.choose(&link, "22.25", RateChoice::Fixed(150_000_000));
        assert_eq!(status, 0, "{out}{err}");
        assert_eq!(exported(&out), "150000000 150000000bit");
        assert!(err.contains("more than half"), "{err}");
        assert!(guest
            .read("report")
            .contains("unshaped in this boot; the link is shaped to 150000000 bit/s"));
        // No probe runs.
        assert_eq!(guest.read("ib_write_bw.calls"), "");
        for dev in ["va", "vb"] {
            assert!(guest.read("tc.calls").contains(&format!(
                "qdisc add dev {dev} root tbf rate 150000000bit burst 8528 limit 16mb"
            )));
        }
        let (_, _, quiet) = guest.choose(&link, "22.25", RateChoice::Fixed(50_000_000));
        assert!(quiet.is_empty(), "{quiet}");
    }

    #[test]
    fn the_calibration_measures_unshaped_then_probes_with_ib_write_bw() {
        let link = Link::new("400mbit").unwrap();
        let script = link.calibration_script("/perf", search(400_000_000), "/out/link-rate.txt");
        let measure = script
            .find("/perf --connect 127.0.0.1 --device rxa")
            .unwrap();
        let search_at = script.find("while [ $lo -le $hi ]").unwrap();
        assert!(measure < search_at, "{script}");
        assert!(script.contains("link_probe() {"), "{script}");
        assert!(
            script.contains("ib_write_bw -x 1 -s 4096 -D 3 -p 17998 -d rxb >"),
            "{script}"
        );
        assert!(
            script.contains("ib_write_bw -x 1 -s 4096 -D 3 -p 17998 -d rxa 127.0.0.1 >"),
            "{script}"
        );
        // The server listening, not a closed connection on its port.
        assert!(script.contains(":464E 0+:0000 0A"), "{script}");
        assert!(script.contains(": > /out/link-rate.txt\n"), "{script}");
        assert!(
            script.contains("export MTRDMA_LINK_RATE_BPS=$rate MTRDMA_LINK_RATE=\"${rate}bit\"")
        );
        let fixed = link.calibration_script("/perf", RateChoice::Fixed(100_000_000), "/out/r");
        assert!(!fixed.contains("link_probe"), "{fixed}");
        assert!(fixed.contains("rate=100000000\n"), "{fixed}");
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
            // Each end receives on one CPU, in order.
            assert!(
                script.contains(&format!(
                    "sh -c 'echo 1 > /sys/class/net/{dev}/queues/rx-0/rps_cpus'"
                )),
                "{script}"
            );
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
