//! A cross-thread shutdown signal that shard tasks can await.
//!
//! Owns: `Shutdown` (cheap clone, set once) and its `wait()` future.
//! Must not: be polled on the per-request hot path; only accept loops and drains await it.
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

/// A shard-local broadcast signal (no locks, no atomics): the accept loop fires it when the
/// process-wide `Shutdown` fires, and idle keep-alive connections awaiting their next request
/// end at once instead of holding sockets open.
#[derive(Default)]
pub struct LocalSignal {
    fired: std::cell::Cell<bool>,
    next: std::cell::Cell<usize>,
    wakers: std::cell::RefCell<Vec<(usize, Waker)>>,
}

impl LocalSignal {
    pub fn fire(&self) {
        self.fired.set(true);
        for (_, w) in self.wakers.take() {
            w.wake();
        }
    }

    pub fn is_fired(&self) -> bool {
        self.fired.get()
    }

    pub fn wait(&self) -> LocalWait<'_> {
        let id = self.next.get();
        self.next.set(id.wrapping_add(1));
        LocalWait { signal: self, id }
    }
}

pub struct LocalWait<'a> {
    signal: &'a LocalSignal,
    id: usize,
}

impl Future for LocalWait<'_> {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.signal.fired.get() {
            return Poll::Ready(());
        }
        let mut w = self.signal.wakers.borrow_mut();
        match w.iter_mut().find(|(id, _)| *id == self.id) {
            Some((_, slot)) => slot.clone_from(cx.waker()),
            None => w.push((self.id, cx.waker().clone())),
        }
        Poll::Pending
    }
}

impl Drop for LocalWait<'_> {
    fn drop(&mut self) {
        if let Ok(mut w) = self.signal.wakers.try_borrow_mut() {
            if let Some(i) = w.iter().position(|(id, _)| *id == self.id) {
                w.swap_remove(i);
            }
        }
    }
}
