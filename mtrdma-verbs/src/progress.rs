//! An optional progress thread for applications that do not poll often.
//!
//! [`ScheduledQueuePair::with_progress_thread`] moves the queue pair behind
//! a mutex and starts a thread that polls it at a fixed interval: it reaps
//! completions, posts what the scheduler lets go next, and delivers
//! finished requests on a channel. The application posts through the
//! returned [`ProgressThread`] and reads [`ProgressThread::completions`].

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};

use crate::{Completion, Error, PostError, ScheduledQueuePair, SendOp};

/// A scheduled queue pair driven by its own thread (see the module docs).
///
/// If the thread stops on its own (the queue pair's poll failed, or it
/// panicked), it says so with a `tracing` error, the completion channel
/// disconnects once drained, every later post is refused with
/// [`Error::ProgressStopped`], and [`stop`](Self::stop) returns the cause.
#[derive(Debug)]
pub struct ProgressThread {
    driver: Driver<ScheduledQueuePair>,
    completions: Receiver<Completion>,
}

/// What a progress thread drives: something it polls for completions.
trait Polled: Send + 'static {
    type Item: Send + 'static;

    fn poll(&mut self, out: &mut Vec<Self::Item>) -> Result<usize, Error>;
}

impl Polled for ScheduledQueuePair {
    type Item = Completion;

    fn poll(&mut self, out: &mut Vec<Completion>) -> Result<usize, Error> {
        crate::PollCompletions::poll(self, out)
    }
}

/// The thread and what it shares with its owner.
#[derive(Debug)]
struct Driver<T> {
    target: Arc<Mutex<T>>,
    stop: Arc<AtomicBool>,
    /// Why the thread stopped on its own, once it has.
    stopped: Arc<OnceLock<String>>,
    thread: Option<JoinHandle<Result<(), Error>>>,
}

impl ScheduledQueuePair {
    /// Starts a thread that polls this queue pair every `interval` (zero:
    /// continuously) and delivers completions on a channel.
    ///
    /// # Panics
    /// If the operating system cannot start a thread.
    pub fn with_progress_thread(self, interval: Duration) -> ProgressThread {
        let (tx, rx) = crossbeam_channel::unbounded();
        ProgressThread {
            driver: Driver::start(self, tx, interval),
            completions: rx,
        }
    }
}

impl<T: Polled> Driver<T> {
    fn start(target: T, tx: Sender<T::Item>, interval: Duration) -> Driver<T> {
        let target = Arc::new(Mutex::new(target));
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::new(OnceLock::new());
        let thread = {
            let (target, stop, stopped) =
                (Arc::clone(&target), Arc::clone(&stop), Arc::clone(&stopped));
            std::thread::Builder::new()
                .name("mtrdma-progress".into())
                .spawn(move || {
                    let run =
                        catch_unwind(AssertUnwindSafe(|| progress(&target, &tx, &stop, interval)));
                    let result = match run {
                        Ok(result) => result,
                        Err(panic) => Err(Error::ProgressStopped {
                            reason: format!("it panicked: {}", panic_message(&*panic)),
                        }),
                    };
                    if let Err(e) = &result {
                        tracing::error!(error = %e, "the progress thread stopped");
                        let _ = stopped.set(e.to_string());
                    }
                    // `tx` drops here: the completion channel disconnects
                    // once what was delivered has been read.
                    result
                })
                .expect("spawn the progress thread")
        };
        Driver {
            target,
            stop,
            stopped,
            thread: Some(thread),
        }
    }

    /// [`Error::ProgressStopped`] once the thread stopped on its own:
    /// nothing would progress a request accepted now.
    fn running(&self) -> Result<(), Error> {
        match self.stopped.get() {
            None => Ok(()),
            Some(reason) => Err(Error::ProgressStopped {
                reason: reason.clone(),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, T> {
        self.target.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Stops the thread and hands back what it drove, with how it ended.
    fn finish(mut self) -> (T, Result<(), Error>) {
        let result = self.join();
        let target = Arc::clone(&self.target);
        drop(self);
        let target = Arc::try_unwrap(target)
            .map(|m| m.into_inner().unwrap_or_else(PoisonError::into_inner))
            .unwrap_or_else(|_| {
                unreachable!("the thread has ended and held the only other reference")
            });
        (target, result)
    }
}

impl<T> Driver<T> {
    /// Stops the thread (if it still runs) and returns how it ended.
    fn join(&mut self) -> Result<(), Error> {
        self.stop.store(true, Ordering::Release);
        match self.thread.take() {
            Some(t) => t.join().unwrap_or_else(|panic| {
                // Only outside `progress` (which is caught): still said.
                Err(Error::ProgressStopped {
                    reason: format!("it panicked: {}", panic_message(&*panic)),
                })
            }),
            None => Ok(()),
        }
    }
}

impl<T> Drop for Driver<T> {
    fn drop(&mut self) {
        // Its error, if any, was said when it stopped.
        let _ = self.join();
    }
}

/// The text of a panic's payload.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_string()
    }
}

fn progress<T: Polled>(
    target: &Mutex<T>,
    tx: &Sender<T::Item>,
    stop: &AtomicBool,
    interval: Duration,
) -> Result<(), Error> {
    let mut out = Vec::new();
    while !stop.load(Ordering::Acquire) {
        target
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .poll(&mut out)?;
        for c in out.drain(..) {
            // A receiver that went away no longer wants completions; the
            // regions are dropped (their requests are finished).
            let _ = tx.send(c);
        }
        if interval.is_zero() {
            std::thread::yield_now();
        } else {
            std::thread::sleep(interval);
        }
    }
    Ok(())
}

impl ProgressThread {
    crate::macros::posting_fn! {
        /// Accepts a send-side request (see [`ScheduledQueuePair::post_send`]).
        /// Refused with [`Error::ProgressStopped`] once the thread stopped on
        /// its own.
        pub fn post_send(&self, op: SendOp) posts (region, range, context) {
            if let Err(e) = self.driver.running() {
                return Err(PostError::new((e, region)));
            }
            self.driver.lock().post_send(op, region, range, context)
        }
    }

    crate::macros::posting_fn! {
        /// Posts a receive. Refused with [`Error::ProgressStopped`] once the
        /// thread stopped on its own.
        pub fn post_recv(&self) posts (region, range, context) {
            if let Err(e) = self.driver.running() {
                return Err(PostError::new((e, region)));
            }
            self.driver.lock().post_recv(region, range, context)
        }
    }

    /// Finished requests and receives, with their regions. Disconnected
    /// (after what was delivered) once the thread has stopped.
    pub fn completions(&self) -> &Receiver<Completion> {
        &self.completions
    }

    /// Whether the thread stopped on its own, and why
    /// ([`Error::ProgressStopped`]).
    pub fn check(&self) -> Result<(), Error> {
        self.driver.running()
    }

    /// Stops the thread and returns the queue pair (with any work still in
    /// flight), and the thread's error if polling failed or it panicked.
    pub fn stop(self) -> (ScheduledQueuePair, Result<(), Error>) {
        self.driver.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Polls `ok` times (one item each), then fails or panics.
    struct Faulty {
        ok: u32,
        panics: bool,
    }

    impl Polled for Faulty {
        type Item = u32;

        fn poll(&mut self, out: &mut Vec<u32>) -> Result<usize, Error> {
            if self.ok == 0 {
                if self.panics {
                    panic!("a fault in the poll");
                }
                return Err(Error::CompletionWait {
                    source: std::io::Error::from_raw_os_error(5),
                });
            }
            self.ok -= 1;
            out.push(self.ok);
            Ok(1)
        }
    }

    fn run(panics: bool) -> (Driver<Faulty>, Receiver<u32>) {
        let (tx, rx) = crossbeam_channel::unbounded();
        let driver = Driver::start(Faulty { ok: 3, panics }, tx, Duration::ZERO);
        (driver, rx)
    }

    #[test]
    fn a_poll_that_fails_stops_the_thread_and_says_why_to_every_caller() {
        let (driver, rx) = run(false);
        // What was polled before the fault is delivered, then the channel
        // disconnects (a reader blocked on it wakes up).
        let got: Vec<u32> = rx.iter().collect();
        assert_eq!(got, [2, 1, 0]);
        let e = driver.running().expect_err("refuses work once stopped");
        assert!(matches!(e, Error::ProgressStopped { .. }), "{e}");
        assert!(e.to_string().contains("Input/output error"), "{e}");
        let (_, result) = driver.finish();
        assert!(matches!(result, Err(Error::CompletionWait { .. })));
    }

    #[test]
    fn a_poll_that_panics_is_reported_not_swallowed() {
        let (driver, rx) = run(true);
        assert_eq!(rx.iter().count(), 3);
        let e = driver.running().expect_err("refuses work once stopped");
        assert!(e.to_string().contains("a fault in the poll"), "{e}");
        let (_, result) = driver.finish();
        let e = result.expect_err("the panic comes back as an error");
        assert!(
            e.to_string().contains("panicked: a fault in the poll"),
            "{e}"
        );
    }

    #[test]
    fn a_thread_asked_to_stop_ends_without_error() {
        let (tx, rx) = crossbeam_channel::unbounded();
        let driver = Driver::start(
            Faulty {
                ok: u32::MAX,
                panics: false,
            },
            tx,
            Duration::from_micros(10),
        );
        assert!(rx.recv().is_ok());
        assert!(driver.running().is_ok());
        let (left, result) = driver.finish();
        assert!(result.is_ok());
        assert!(left.ok < u32::MAX);
    }
}
