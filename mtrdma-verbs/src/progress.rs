//! An optional progress thread for applications that do not poll often.
//!
//! [`ScheduledQueuePair::with_progress_thread`] moves the queue pair behind
//! a mutex and starts a thread that polls it at a fixed interval: it reaps
//! completions, posts what the scheduler lets go next, and delivers
//! finished requests on a channel. The application posts through the
//! returned [`ProgressThread`] and reads [`ProgressThread::completions`].

use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};

use crate::{Completion, Error, MemoryRegion, PostError, ScheduledQueuePair, SendOp};

/// A scheduled queue pair driven by its own thread (see the module docs).
#[derive(Debug)]
pub struct ProgressThread {
    qp: Arc<Mutex<ScheduledQueuePair>>,
    completions: Receiver<Completion>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Result<(), Error>>>,
}

impl ScheduledQueuePair {
    /// Starts a thread that polls this queue pair every `interval` (zero:
    /// continuously) and delivers completions on a channel.
    pub fn with_progress_thread(self, interval: Duration) -> ProgressThread {
        let qp = Arc::new(Mutex::new(self));
        let (tx, rx) = crossbeam_channel::unbounded();
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (qp, stop) = (Arc::clone(&qp), Arc::clone(&stop));
            std::thread::Builder::new()
                .name("mtrdma-progress".into())
                .spawn(move || progress(&qp, &tx, &stop, interval))
                .expect("spawn the progress thread")
        };
        ProgressThread {
            qp,
            completions: rx,
            stop,
            thread: Some(thread),
        }
    }
}

fn progress(
    qp: &Mutex<ScheduledQueuePair>,
    tx: &Sender<Completion>,
    stop: &AtomicBool,
    interval: Duration,
) -> Result<(), Error> {
    let mut out = Vec::new();
    while !stop.load(Ordering::Acquire) {
        qp.lock()
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
    /// Accepts a send-side request (see [`ScheduledQueuePair::post_send`]).
    pub fn post_send(
        &self,
        op: SendOp,
        region: MemoryRegion,
        range: Range<usize>,
        context: u64,
    ) -> Result<(), PostError> {
        self.lock().post_send(op, region, range, context)
    }

    /// Posts a receive.
    pub fn post_recv(
        &self,
        region: MemoryRegion,
        range: Range<usize>,
        context: u64,
    ) -> Result<(), PostError> {
        self.lock().post_recv(region, range, context)
    }

    /// Finished requests and receives, with their regions.
    pub fn completions(&self) -> &Receiver<Completion> {
        &self.completions
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ScheduledQueuePair> {
        self.qp.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Stops the thread and returns the queue pair (with any work still in
    /// flight), and the thread's error if polling failed.
    pub fn stop(mut self) -> (ScheduledQueuePair, Result<(), Error>) {
        let result = self.join();
        let qp = Arc::clone(&self.qp);
        drop(self);
        let qp = Arc::try_unwrap(qp)
            .map(|m| m.into_inner().unwrap_or_else(PoisonError::into_inner))
            .unwrap_or_else(|_| {
                unreachable!("the thread has ended and held the only other reference")
            });
        (qp, result)
    }

    fn join(&mut self) -> Result<(), Error> {
        self.stop.store(true, Ordering::Release);
        match self.thread.take() {
            Some(t) => t.join().unwrap_or(Ok(())),
            None => Ok(()),
        }
    }
}

impl Drop for ProgressThread {
    fn drop(&mut self) {
        if let Err(e) = self.join() {
            tracing::warn!(error = %e, "the progress thread stopped with an error");
        }
    }
}
