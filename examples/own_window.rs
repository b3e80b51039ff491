//! A window of your own in mtrdma's data path: a byte budget per unit of
//! the tenant's weight.
//!
//! ```sh
//! cargo run --release --example own_window -- [DEVICE]   # default: the first active one
//! ```
//!
//! `Budget` below implements `mtrdma::sched::Window` (admit, on_sent,
//! on_completed, window, and `signals`, through which a policy reload's new
//! weight reaches it) and its own `WindowFactory`, and is plugged into a
//! bulk queue pair with `ScheduleConfig::with_window`, as a congestion
//! controller is plugged into a quinn connection. The engine asks it before
//! every piece and tells it of every piece posted and completed. One 1 MiB
//! WRITE goes in 4 KiB pieces, 16 of which may be in the NIC at once:
//! without a window up to 64 KiB are out, under a budget of 8 KiB (4 KiB
//! per unit of weight, weight 2) at most two pieces. The example prints the
//! most bytes it saw in the NIC each way. (`mtrdma::sched::FixedWindow`
//! is a fixed budget that ships with the crate.)
//!
//! (Under a policy with a latency bound, a tenant's own window is replaced
//! by the bound's delay window: the operator does not trust it to hold
//! the bound. This example's queue pair is a tenant of its own process,
//! with no policy.)

use mtrdma::sched::{Admit, ConfigError, Nanos, Signals, Window, WindowFactory};
use mtrdma::verbs::PollCompletions;
use mtrdma::verbs::{Access, Context, ProtectionDomain, ScheduleConfig, SendOp};
use mtrdma::{TenantId, TrafficClass};

/// At most `per_weight` bytes in the NIC for each unit of the tenant's
/// weight (one piece at least, so that a piece larger than the budget
/// still goes, alone).
#[derive(Debug, Clone, Copy)]
struct Budget {
    per_weight: u64,
    weight: u32,
}

impl Budget {
    fn bytes(&self) -> u64 {
        self.per_weight.saturating_mul(u64::from(self.weight))
    }
}

impl Window for Budget {
    fn admit(&self, in_flight: u64, bytes: u64, _now: Nanos) -> Admit {
        if in_flight == 0 || in_flight.saturating_add(bytes) <= self.bytes() {
            Admit::Now
        } else {
            Admit::AfterCompletion
        }
    }

    fn on_sent(&mut self, _bytes: u64, _now: Nanos) {}

    fn on_completed(&mut self, _bytes: u64, _sent_at: Nanos, _now: Nanos) {}

    fn window(&self) -> u64 {
        self.bytes()
    }

    /// A policy reload's weight; the link rate and gains do not move a
    /// fixed budget.
    fn signals(&mut self, signals: &Signals) {
        if let Some(weight) = signals.weight {
            self.weight = weight.max(1);
        }
    }
}

/// Makes a budget for each queue pair, of the weight the engine passes
/// (its tenant's) unless `weight` names one.
#[derive(Debug, Clone, Copy)]
struct PerWeight {
    per_weight: u64,
    weight: Option<u32>,
}

impl WindowFactory for PerWeight {
    fn build(&self, _seed: u64, weight: u32) -> Result<Box<dyn Window>, ConfigError> {
        Ok(Box::new(Budget {
            per_weight: self.per_weight,
            weight: self.weight.unwrap_or(weight).max(1),
        }))
    }

    fn weight(&self) -> Option<u32> {
        self.weight
    }
}

/// Posts one 1 MiB WRITE in 4 KiB pieces with `config`'s window; returns
/// the most bytes the queue pair had in the NIC while it went (0 without
/// a window: the engine keeps the count only for windows).
fn most_in_flight(
    pd: &ProtectionDomain,
    config: ScheduleConfig,
) -> Result<u64, Box<dyn std::error::Error>> {
    const LEN: usize = 1 << 20;
    let (a, b) = (pd.queue_pair().build()?, pd.queue_pair().build()?);
    let (ea, eb) = (a.endpoint(), b.endpoint());
    let mut qp = a.connect(&eb)?.scheduled(config)?;
    let _peer = b.connect(&ea)?;
    let target = pd.allocate(LEN, Access::REMOTE_READ_WRITE)?;
    let remote = target.remote().ok_or("the target has remote access")?;
    qp.post_send(
        SendOp::Write(remote),
        pd.allocate(LEN, Access::LOCAL)?,
        0..LEN,
        1,
    )?;
    let (mut done, mut most) = (Vec::new(), 0);
    while done.is_empty() {
        if let Some(w) = qp.window() {
            most = most.max(w.in_flight_bytes);
        }
        qp.poll(&mut done)?;
    }
    if !done[0].status.is_success() {
        return Err(format!("the WRITE failed: {:?}", done[0].status).into());
    }
    Ok(most)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let ctx = match std::env::args().nth(1) {
        Some(name) => Context::open(&name)?,
        None => Context::open_first_active()?,
    };
    let pd = ctx.alloc_pd()?;
    let config = ScheduleConfig {
        chunk_bytes: 4096,
        max_pieces_in_flight: 16,
        ..ScheduleConfig::local(TenantId(1), TrafficClass::Bulk)
    };
    // A budget larger than anything the queue pair may have out shows what
    // it keeps in the NIC with no bound but its 16 pieces.
    let open = PerWeight {
        per_weight: u64::MAX,
        weight: None,
    };
    let open = most_in_flight(&pd, config.clone().with_window(open))?;
    // Weight 2, named: a tenant of this process's own has no policy weight.
    let budget = PerWeight {
        per_weight: 4096,
        weight: Some(2),
    };
    let budget = most_in_flight(&pd, config.with_window(budget))?;
    println!("most bytes in the NIC, 16 pieces of 4096 B allowed: {open}");
    println!("most bytes in the NIC, under an 8192 B budget: {budget}");
    Ok(())
}
