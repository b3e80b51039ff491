//! The futures of incoming completions ([`AsyncQueuePair::incoming`],
//! [`AsyncQueuePair::incoming_many`]): completions of requests posted with
//! contexts of the caller's own.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

#[cfg(doc)]
use super::AsyncQueuePair;
use super::{drive, AsyncQueue, Shared, INCOMING};
use crate::Error;

/// The next incoming completion ([`AsyncQueuePair::incoming`]): a future.
/// Dropping it loses nothing: a completion it did not take waits for the
/// next.
#[must_use = "a future does nothing unless awaited"]
pub struct Incoming<Q: AsyncQueue> {
    pub(super) shared: Arc<Shared<Q>>,
}

impl<Q: AsyncQueue> fmt::Debug for Incoming<Q> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Incoming").finish_non_exhaustive()
    }
}

impl<Q: AsyncQueue> Future for Incoming<Q> {
    type Output = Result<Q::Completion, Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut wake = Vec::new();
        let result = drive(
            &self.shared,
            INCOMING,
            |st| st.incoming.pop_front(),
            cx,
            &mut wake,
        );
        for w in wake {
            w.wake();
        }
        result
    }
}

/// The incoming completions found in one wake
/// ([`AsyncQueuePair::incoming_many`]): a future.
#[must_use = "a future does nothing unless awaited"]
pub struct IncomingMany<'a, Q: AsyncQueue> {
    pub(super) next: Incoming<Q>,
    pub(super) out: &'a mut Vec<Q::Completion>,
    pub(super) limit: usize,
}

impl<Q: AsyncQueue> fmt::Debug for IncomingMany<'_, Q> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IncomingMany")
            .field("limit", &self.limit)
            .finish_non_exhaustive()
    }
}

impl<Q: AsyncQueue> Future for IncomingMany<'_, Q> {
    type Output = Result<usize, Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        if this.limit == 0 {
            return Poll::Ready(Ok(0));
        }
        // What was found already, or what one poll finds, straight into
        // `out` (not through `incoming`: one move a completion, not three).
        let mut wake = Vec::new();
        let moved = {
            let mut guard = this.next.shared.lock();
            let st = &mut *guard;
            let queued = st.incoming.len().min(this.limit);
            this.out.extend(st.incoming.drain(..queued));
            if queued > 0 {
                Ok(queued)
            } else {
                match st.qp.waitable().poll(&mut st.scratch) {
                    Ok(_) => Ok(st.route(Some((this.out, this.limit)), &mut wake)),
                    Err(e) => {
                        // As `collect`: what the poll found waits for the
                        // next call, and this one says the error.
                        st.route(None, &mut wake);
                        Err(e)
                    }
                }
            }
        };
        for w in wake {
            w.wake();
        }
        match moved {
            Ok(0) => {}
            done => return Poll::Ready(done),
        }
        // Nothing yet: wait as `incoming` does.
        let first = match Pin::new(&mut this.next).poll(cx) {
            Poll::Ready(Ok(c)) => c,
            Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
            Poll::Pending => return Poll::Pending,
        };
        this.out.push(first);
        let mut st = this.next.shared.lock();
        let more = st.incoming.len().min(this.limit - 1);
        this.out.extend(st.incoming.drain(..more));
        Poll::Ready(Ok(more + 1))
    }
}

impl<Q: AsyncQueue> Drop for Incoming<Q> {
    fn drop(&mut self) {
        let mut wake = Vec::new();
        {
            self.shared.lock().leave(INCOMING, &mut wake);
        }
        for w in wake {
            w.wake();
        }
    }
}
