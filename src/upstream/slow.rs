//! The signal that an upstream answer is slow: the exchange sets it when no response head has
//! come by a caller-chosen time after the send began (or at once where it cannot tell cheaply:
//! a fresh connection, a TLS one, a body written in pieces), and the caller awaits it to start
//! what only slow answers need (`forward::open` watches its client for leaving). It rides the
//! first-byte deadline's timer entry of a pooled connection's armed read (`Conn::armed_read`):
//! a fast answer pays no timer entry and no allocation for it.
//!
//! Owns: one flag and the waker of the one task waiting for it. Must not: know what the
//! caller starts, or be shared across tasks of different shards (`!Send`: `Cell`s).

use std::cell::Cell;
use std::future::Future;
use std::task::{Poll, Waker};
use std::time::Duration;

pub struct Slow {
    after: Duration,
    due: Cell<bool>,
    waker: Cell<Option<Waker>>,
}

impl Slow {
    /// An answer is slow once `after` has passed since its send began without a head.
    pub fn new(after: Duration) -> Slow {
        Slow {
            after,
            due: Cell::new(false),
            waker: Cell::new(None),
        }
    }

    pub fn after(&self) -> Duration {
        self.after
    }

    pub fn is_due(&self) -> bool {
        self.due.get()
    }

    /// Mark the answer slow and wake the waiter (once; later calls do nothing).
    pub fn fire(&self) {
        if !self.due.replace(true) {
            if let Some(w) = self.waker.take() {
                w.wake();
            }
        }
    }

    /// Ready once [`Slow::fire`] was called.
    pub fn wait(&self) -> impl Future<Output = ()> + '_ {
        std::future::poll_fn(move |cx| {
            if self.due.get() {
                return Poll::Ready(());
            }
            let w = match self.waker.take() {
                Some(w) if w.will_wake(cx.waker()) => w,
                _ => cx.waker().clone(),
            };
            self.waker.set(Some(w));
            Poll::Pending
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::pin::pin;
    use std::task::Context;

    #[test]
    fn wait_is_pending_until_fired_and_fire_wakes_the_waiter() {
        let slow = Slow::new(Duration::from_millis(10));
        let woken = std::sync::Arc::new(Flag(std::sync::atomic::AtomicBool::new(false)));
        let waker = Waker::from(woken.clone());
        let mut cx = Context::from_waker(&waker);
        let mut w = pin!(slow.wait());
        assert!(w.as_mut().poll(&mut cx).is_pending());
        assert!(!slow.is_due());
        slow.fire();
        assert!(
            woken.0.load(std::sync::atomic::Ordering::SeqCst),
            "fire wakes"
        );
        assert!(w.as_mut().poll(&mut cx).is_ready());
        slow.fire(); // a second fire is harmless
        assert!(pin!(slow.wait()).poll(&mut cx).is_ready());
    }

    struct Flag(std::sync::atomic::AtomicBool);
    impl std::task::Wake for Flag {
        fn wake(self: std::sync::Arc<Self>) {
            self.0.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    }
}
