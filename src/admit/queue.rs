//! The `block`-mode wait queue: a bounded, strictly FIFO line of requests waiting for budget.
//!
//! Owns: the waiter list, [`Budget::acquire_or_wait`], and serving waiters when bytes or slots
//! come back (`Budget::pump`).
//! Must not: grow past `max_queue`, let a waiter outlive its future (a dropped or timed-out waiter
//! removes itself), hold a `RefCell` borrow across a wake, or use threads/atomics.
//!
//! Ordering choice — strict FIFO with hand-off: only the waiter at the head is ever considered.
//! When bytes return, the budget *grants* the head directly (its bytes and slot are taken on its
//! behalf before it is woken), so nobody can steal them between the wake and the poll. While the
//! queue is non-empty, newcomers (even tiny ones, and `try_acquire` callers) go behind it. A large
//! head therefore blocks smaller followers until it fits, times out or goes away; that is the price
//! of never starving large requests, and it is bounded by the queue timeout. Requests larger than
//! the whole budget are refused up front, so the head can always fit eventually.
//! `Permit::grow` from already-admitted requests bypasses the queue (they are finishing work).

use std::cell::Cell;
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use super::budget::{Budget, Reject};
use super::permit::Permit;

/// The queue of waiters of one budget.
pub(super) struct WaitQueue {
    waiters: VecDeque<Rc<Waiter>>,
    max_len: usize,
}

/// One queued request. Shared between the queue (until granted or removed) and its future.
struct Waiter {
    bytes: u64,
    /// Set by the pump when the waiter's bytes and slot were taken on its behalf.
    granted: Cell<bool>,
    waker: Cell<Option<Waker>>,
}

impl WaitQueue {
    pub(super) fn new(max_len: usize) -> WaitQueue {
        WaitQueue {
            waiters: VecDeque::new(),
            max_len,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.waiters.len()
    }

    pub(super) fn max_len(&self) -> usize {
        self.max_len
    }

    fn remove(&mut self, w: &Rc<Waiter>) {
        if let Some(i) = self.waiters.iter().position(|x| Rc::ptr_eq(x, w)) {
            self.waiters.remove(i);
        }
    }
}

impl Budget {
    /// Takes `bytes` and a slot now if possible; otherwise waits in FIFO order for at most
    /// `deadline` (a duration from now).
    ///
    /// Errors: `Budget` if `bytes` exceeds the whole capacity (can never fit), `QueueFull` if the
    /// queue is at `max_queue`, `QueueTimeout` at the deadline. All are counted. Dropping the
    /// returned future at any point leaves no trace (a granted-but-unclaimed permit is returned).
    /// Must run inside a monoio runtime with the timer enabled.
    pub async fn acquire_or_wait(&self, bytes: u64, deadline: Duration) -> Result<Permit, Reject> {
        if bytes > self.capacity() {
            self.record_rejection(Reject::Budget);
            return Err(Reject::Budget);
        }
        let waiter = {
            let Ok(mut q) = self.inner.queue.try_borrow_mut() else {
                // Unreachable in practice (borrows never span an await); fail closed.
                self.record_rejection(Reject::QueueFull);
                return Err(Reject::QueueFull);
            };
            if q.waiters.is_empty() && self.check(bytes).is_ok() {
                drop(q);
                self.take(bytes);
                return Ok(Permit::new(self.clone(), bytes));
            }
            if q.waiters.len() >= q.max_len {
                drop(q);
                self.record_rejection(Reject::QueueFull);
                return Err(Reject::QueueFull);
            }
            let w = Rc::new(Waiter {
                bytes,
                granted: Cell::new(false),
                waker: Cell::new(None),
            });
            q.waiters.push_back(Rc::clone(&w));
            w
        };
        let wait = WaitFor {
            budget: self.clone(),
            waiter: Some(waiter),
        };
        match monoio::time::timeout(deadline, wait).await {
            Ok(permit) => Ok(permit),
            Err(_elapsed) => {
                self.record_rejection(Reject::QueueTimeout);
                Err(Reject::QueueTimeout)
            }
        }
    }

    /// Serves the head of the queue while it fits: takes its bytes and slot and wakes it.
    pub(super) fn pump(&self) {
        loop {
            let waker = {
                let Ok(mut q) = self.inner.queue.try_borrow_mut() else {
                    return;
                };
                let Some(head) = q.waiters.front() else {
                    return;
                };
                if Rc::strong_count(head) == 1 {
                    // Its future is gone without removing it (cannot happen via WaitFor's drop,
                    // but never grant bytes to nobody).
                    q.waiters.pop_front();
                    continue;
                }
                if self.check(head.bytes).is_err() {
                    return;
                }
                let Some(w) = q.waiters.pop_front() else {
                    return;
                };
                self.take(w.bytes);
                w.granted.set(true);
                w.waker.take()
            };
            if let Some(waker) = waker {
                waker.wake();
            }
        }
    }
}

/// The future of one queued waiter; removes itself (or returns a grant) on drop.
struct WaitFor {
    budget: Budget,
    waiter: Option<Rc<Waiter>>,
}

impl Future for WaitFor {
    type Output = Permit;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Permit> {
        let Some(w) = self.waiter.as_ref() else {
            // Polled after completion: stay pending rather than panic.
            return Poll::Pending;
        };
        if w.granted.get() {
            let bytes = w.bytes;
            self.waiter = None;
            return Poll::Ready(Permit::new(self.budget.clone(), bytes));
        }
        let new = match w.waker.take() {
            Some(old) if old.will_wake(cx.waker()) => old,
            _ => cx.waker().clone(),
        };
        w.waker.set(Some(new));
        Poll::Pending
    }
}

impl Drop for WaitFor {
    fn drop(&mut self) {
        let Some(w) = self.waiter.take() else {
            return;
        };
        if w.granted.get() {
            // Granted but never claimed: give the bytes and slot back (this pumps).
            self.budget.release(w.bytes, 1);
        } else {
            if let Ok(mut q) = self.budget.inner.queue.try_borrow_mut() {
                q.remove(&w);
            }
            drop(w);
            // The head may have changed (or was us): let the next one in if it fits.
            self.budget.pump();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admit::tests::rt;
    use std::cell::RefCell;
    use std::time::Instant;

    /// A task waiting up to `wait` for `bytes` of `b`: the bytes granted, or why not.
    fn waiter(
        b: &Budget,
        bytes: u64,
        wait: Duration,
    ) -> monoio::task::JoinHandle<Result<u64, Reject>> {
        let b = b.clone();
        monoio::spawn(async move { b.acquire_or_wait(bytes, wait).await.map(|p| p.bytes()) })
    }

    async fn yield_a_bit() {
        monoio::time::sleep(Duration::from_millis(5)).await;
    }

    #[test]
    fn immediate_when_free() {
        rt().block_on(async {
            let b = Budget::new(100, 10, 4);
            let p = b.acquire_or_wait(60, Duration::from_secs(1)).await.unwrap();
            assert_eq!((b.used(), b.queued()), (60, 0));
            drop(p);
            assert_eq!(b.used(), 0);
        });
    }

    #[test]
    fn fifo_order_and_serve_when_freed() {
        rt().block_on(async {
            let b = Budget::new(100, 10, 8);
            let first = b.try_acquire(100).unwrap();
            let order = Rc::new(RefCell::new(Vec::new()));
            let mut handles = Vec::new();
            // A big waiter then small ones: the small ones must not overtake it.
            for (i, bytes) in [(0u32, 80u64), (1, 10), (2, 10), (3, 10)] {
                let (b, order) = (b.clone(), order.clone());
                handles.push(monoio::spawn(async move {
                    let p = b.acquire_or_wait(bytes, Duration::from_secs(5)).await;
                    order.borrow_mut().push(i);
                    let p = p.unwrap();
                    monoio::time::sleep(Duration::from_millis(20)).await;
                    drop(p);
                }));
                yield_a_bit().await;
            }
            assert_eq!(b.queued(), 4);
            // A newcomer that would fit in nothing is also behind the queue.
            assert_eq!(b.try_acquire(0).err(), Some(Reject::Budget));
            drop(first);
            for h in handles {
                h.await;
            }
            assert_eq!(*order.borrow(), vec![0, 1, 2, 3]);
            assert_eq!((b.used(), b.in_flight(), b.queued()), (0, 0, 0));
            assert_eq!(b.rejections(Reject::QueueTimeout), 0);
        });
    }

    #[test]
    fn several_served_by_one_release() {
        rt().block_on(async {
            let b = Budget::new(100, 10, 8);
            let first = b.try_acquire(90).unwrap();
            let mut hs = Vec::new();
            for _ in 0..3 {
                hs.push(waiter(&b, 30, Duration::from_secs(5)));
                yield_a_bit().await;
            }
            assert_eq!(b.queued(), 3);
            drop(first);
            for h in hs {
                assert_eq!(h.await, Ok(30));
            }
            assert_eq!(b.used(), 0);
            assert_eq!(b.peak(), 90);
        });
    }

    #[test]
    fn in_flight_limit_queues_too() {
        rt().block_on(async {
            let b = Budget::new(1000, 1, 8);
            let first = b.try_acquire(1).unwrap();
            let h = waiter(&b, 1, Duration::from_secs(5));
            yield_a_bit().await;
            assert_eq!(b.queued(), 1);
            drop(first);
            assert_eq!(h.await, Ok(1));
            assert_eq!(b.in_flight(), 0);
        });
    }

    #[test]
    fn timeout_at_deadline() {
        rt().block_on(async {
            let b = Budget::new(100, 10, 8);
            let hold = b.try_acquire(100).unwrap();
            let t0 = Instant::now();
            let r = b.acquire_or_wait(10, Duration::from_millis(50)).await;
            let waited = t0.elapsed();
            assert_eq!(r.err(), Some(Reject::QueueTimeout));
            assert!(waited >= Duration::from_millis(45), "{waited:?}");
            assert!(waited < Duration::from_millis(1000), "{waited:?}");
            assert_eq!(b.queued(), 0);
            assert_eq!(b.rejections(Reject::QueueTimeout), 1);
            drop(hold);
            assert_eq!(b.used(), 0);
        });
    }

    #[test]
    fn timed_out_head_lets_followers_in() {
        rt().block_on(async {
            let b = Budget::new(100, 10, 8);
            let hold = b.try_acquire(50).unwrap();
            let big = waiter(&b, 80, Duration::from_millis(30));
            yield_a_bit().await;
            let small = waiter(&b, 10, Duration::from_secs(5));
            yield_a_bit().await;
            assert_eq!(b.queued(), 2);
            assert_eq!(big.await, Err(Reject::QueueTimeout));
            assert_eq!(small.await, Ok(10));
            drop(hold);
            assert_eq!((b.used(), b.in_flight(), b.queued()), (0, 0, 0));
        });
    }

    #[test]
    fn queue_full_and_too_large() {
        rt().block_on(async {
            let b = Budget::new(100, 10, 1);
            let hold = b.try_acquire(100).unwrap();
            assert_eq!(
                b.acquire_or_wait(101, Duration::from_secs(1)).await.err(),
                Some(Reject::Budget)
            );
            let w = waiter(&b, 10, Duration::from_millis(100));
            yield_a_bit().await;
            assert_eq!(
                b.acquire_or_wait(10, Duration::from_secs(1)).await.err(),
                Some(Reject::QueueFull)
            );
            assert_eq!(w.await, Err(Reject::QueueTimeout));
            assert_eq!(b.rejections_all(), [1, 0, 1, 1, 0]);
            drop(hold);
        });
    }

    #[test]
    fn dropped_waiter_cleans_up() {
        rt().block_on(async {
            let b = Budget::new(100, 10, 8);
            let hold = b.try_acquire(100).unwrap();
            // Cancel a waiter mid-wait by racing it against a short sleep.
            let b1 = b.clone();
            let fut = b1.acquire_or_wait(10, Duration::from_secs(10));
            let r = monoio::time::timeout(Duration::from_millis(20), fut).await;
            assert!(r.is_err());
            assert_eq!(b.queued(), 0);
            // Drop a waiter that was granted but never polled again.
            let b2 = b.clone();
            let mut fut = Box::pin(b2.acquire_or_wait(40, Duration::from_secs(10)));
            let waker = Waker::noop();
            let mut cx = Context::from_waker(waker);
            assert!(fut.as_mut().poll(&mut cx).is_pending());
            assert_eq!(b.queued(), 1);
            drop(hold); // grants the waiter: bytes taken on its behalf
            assert_eq!((b.used(), b.in_flight(), b.queued()), (40, 1, 0));
            drop(fut);
            assert_eq!((b.used(), b.in_flight(), b.queued()), (0, 0, 0));
            assert_eq!(b.rejections(Reject::QueueTimeout), 0);
        });
    }
}
