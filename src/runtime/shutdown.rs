//! A cross-thread shutdown signal that shard tasks can await.
//!
//! Owns: `Shutdown` (cheap clone, set once) and its `wait()` future; `LocalSignal`, the
//! shard-local equivalent.
//! Must not: poll `Shutdown` on the per-request hot path (only accept loops await it); a
//! `LocalSignal` wait costs O(1) per poll and may be.
//! Uses `Arc`/`Mutex` deliberately: shutdown is one of the rare explicit cross-shard events.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

#[derive(Clone, Default)]
pub struct Shutdown {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    fired: AtomicBool,
    next_id: AtomicUsize,
    /// One slot per waiting `Wait` (keyed by its id) so re-polling never grows the list.
    wakers: Mutex<Vec<(usize, Waker)>>,
}

impl Shutdown {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn fire(&self) {
        self.inner.fired.store(true, Ordering::SeqCst);
        let wakers = match self.inner.wakers.lock() {
            Ok(mut w) => std::mem::take(&mut *w),
            Err(p) => std::mem::take(&mut *p.into_inner()),
        };
        for (_, w) in wakers {
            w.wake();
        }
    }

    pub fn is_fired(&self) -> bool {
        self.inner.fired.load(Ordering::SeqCst)
    }

    /// Resolves once `fire` has been called (from any thread).
    pub fn wait(&self) -> Wait {
        Wait {
            inner: self.inner.clone(),
            id: self.inner.next_id.fetch_add(1, Ordering::Relaxed),
        }
    }
}

pub struct Wait {
    inner: Arc<Inner>,
    id: usize,
}

impl Drop for Wait {
    fn drop(&mut self) {
        if let Ok(mut w) = self.inner.wakers.lock() {
            w.retain(|(id, _)| *id != self.id);
        }
    }
}

impl Future for Wait {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.inner.fired.load(Ordering::SeqCst) {
            return Poll::Ready(());
        }
        if let Ok(mut w) = self.inner.wakers.lock() {
            match w.iter_mut().find(|(id, _)| *id == self.id) {
                Some((_, slot)) => slot.clone_from(cx.waker()),
                None => w.push((self.id, cx.waker().clone())),
            }
        }
        if self.inner.fired.load(Ordering::SeqCst) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

/// A shard-local broadcast signal (no locks, no atomics). Shards use two: `draining` (the
/// accept loop fires it when the process-wide `Shutdown` fires; idle keep-alive connections end
/// at once instead of holding sockets open) and `drain_expired` (fired when the drain time is
/// up; streams still running end with their dialect's error event and a proper chunked end).
///
/// Waiters live in a slab: registering, re-polling and dropping a wait are O(1), so a stream may
/// keep one wait for its whole life and poll it once per relayed piece at near-zero cost.
#[derive(Default)]
pub struct LocalSignal {
    fired: std::cell::Cell<bool>,
    slots: std::cell::RefCell<Vec<Option<Waker>>>,
    free: std::cell::RefCell<Vec<usize>>,
}

impl LocalSignal {
    pub fn fire(&self) {
        self.fired.set(true);
        let wakers: Vec<Waker> = self
            .slots
            .borrow_mut()
            .iter_mut()
            .filter_map(Option::take)
            .collect();
        for w in wakers {
            w.wake();
        }
    }

    pub fn is_fired(&self) -> bool {
        self.fired.get()
    }

    pub fn wait(&self) -> LocalWait<'_> {
        LocalWait {
            signal: self,
            slot: None,
        }
    }

    /// Waiters currently registered (tests).
    pub fn waiters(&self) -> usize {
        self.slots.borrow().iter().filter(|w| w.is_some()).count()
    }
}

pub struct LocalWait<'a> {
    signal: &'a LocalSignal,
    /// Index in the signal's slab once registered.
    slot: Option<usize>,
}

impl Future for LocalWait<'_> {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let sig = self.signal;
        if sig.fired.get() {
            return Poll::Ready(());
        }
        let mut slots = sig.slots.borrow_mut();
        match self.slot {
            Some(i) => {
                if let Some(slot) = slots.get_mut(i) {
                    match slot {
                        Some(w) if w.will_wake(cx.waker()) => {}
                        _ => *slot = Some(cx.waker().clone()),
                    }
                }
            }
            None => {
                let w = Some(cx.waker().clone());
                let i = match sig.free.borrow_mut().pop() {
                    Some(i) => {
                        if let Some(slot) = slots.get_mut(i) {
                            *slot = w;
                        }
                        i
                    }
                    None => {
                        slots.push(w);
                        slots.len() - 1
                    }
                };
                drop(slots);
                self.slot = Some(i);
            }
        }
        Poll::Pending
    }
}

impl Drop for LocalWait<'_> {
    fn drop(&mut self) {
        if let Some(i) = self.slot {
            if let Ok(mut slots) = self.signal.slots.try_borrow_mut() {
                if let Some(slot) = slots.get_mut(i) {
                    *slot = None;
                }
                if let Ok(mut free) = self.signal.free.try_borrow_mut() {
                    free.push(i);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;
    use std::task::Wake;

    struct Count(AtomicU32);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn local_signal_slots_are_reused_and_all_woken() {
        let sig = LocalSignal::default();
        let c = Arc::new(Count(AtomicU32::new(0)));
        let waker = Waker::from(c.clone());
        let mut cx = Context::from_waker(&waker);
        let mut a = Box::pin(sig.wait());
        let mut b = Box::pin(sig.wait());
        assert!(a.as_mut().poll(&mut cx).is_pending());
        assert!(
            a.as_mut().poll(&mut cx).is_pending(),
            "re-poll keeps one slot"
        );
        assert!(b.as_mut().poll(&mut cx).is_pending());
        assert_eq!(sig.waiters(), 2);
        drop(a);
        assert_eq!(sig.waiters(), 1);
        let mut d = Box::pin(sig.wait());
        assert!(d.as_mut().poll(&mut cx).is_pending());
        assert_eq!(sig.slots.borrow().len(), 2, "the freed slot is reused");
        sig.fire();
        assert_eq!(c.0.load(Ordering::SeqCst), 2);
        assert!(b.as_mut().poll(&mut cx).is_ready());
        assert!(d.as_mut().poll(&mut cx).is_ready());
        assert!(sig.is_fired());
    }
}
