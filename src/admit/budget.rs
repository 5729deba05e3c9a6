//! A shard's byte budget: capacity, bytes in use, permits in flight, peak, rejection counters.
//!
//! Owns: the accounting cells of one shard and the rejection reasons ([`Reject`]). It hands out
//! [`Permit`]s (`try_acquire`) and connection charges (`charge_connection`, in `connection.rs`)
//! and takes bytes back (`release`), waking the wait queue when it does.
//! Must not: be shared across threads (it is `Rc`/`Cell` only, one per shard), allocate per
//! request beyond the permit itself, block, or know about HTTP. Waiting lives in `queue.rs`.
//!
//! Invariants: `used <= capacity` and `in_flight <= max_in_flight` at all times; every byte and slot
//! handed out comes back exactly once (via `Permit`'s or `ConnCharge`'s drop), so a shard with no
//! requests has `used == connection_bytes`, and one with no connections either has `used == 0`.

use std::cell::{Cell, RefCell};
use std::fmt;
use std::rc::Rc;

use super::permit::Permit;
use super::queue::WaitQueue;

/// Why a request (or a permit growth) was refused. Labels are stable metric label values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reject {
    /// Not enough bytes left in the shard budget (or the request is larger than the whole budget).
    Budget,
    /// The shard already has `max_in_flight` permits out.
    InFlight,
    /// `block` mode: the wait queue is at `max_queue`.
    QueueFull,
    /// `block` mode: waited `queue_timeout_ms` without being served.
    QueueTimeout,
    /// The declared body exceeds `max_body`.
    BodyTooLarge,
}

impl Reject {
    /// Number of reasons (size of per-reason counter arrays).
    pub const COUNT: usize = 5;
    /// All reasons, in `index()` order.
    pub const ALL: [Reject; Reject::COUNT] = [
        Reject::Budget,
        Reject::InFlight,
        Reject::QueueFull,
        Reject::QueueTimeout,
        Reject::BodyTooLarge,
    ];

    /// Stable metric label: `budget`, `in_flight`, `queue_full`, `queue_timeout`, `body_too_large`.
    pub fn as_str(self) -> &'static str {
        match self {
            Reject::Budget => "budget",
            Reject::InFlight => "in_flight",
            Reject::QueueFull => "queue_full",
            Reject::QueueTimeout => "queue_timeout",
            Reject::BodyTooLarge => "body_too_large",
        }
    }

    /// Position in [`Reject::ALL`] and in per-reason counter arrays.
    pub fn index(self) -> usize {
        match self {
            Reject::Budget => 0,
            Reject::InFlight => 1,
            Reject::QueueFull => 2,
            Reject::QueueTimeout => 3,
            Reject::BodyTooLarge => 4,
        }
    }

    /// Suggested HTTP status: 413 for `BodyTooLarge`, 503 (with `Retry-After`) otherwise.
    pub fn http_status(self) -> u16 {
        match self {
            Reject::BodyTooLarge => 413,
            _ => 503,
        }
    }
}

impl Reject {
    /// As an `io::Error` of kind `OutOfMemory` carrying this reason (for I/O-shaped APIs such as
    /// `ChunkChain::read_from`).
    pub fn into_io(self) -> std::io::Error {
        std::io::Error::new(std::io::ErrorKind::OutOfMemory, self)
    }

    /// The reason inside an `io::Error` made by [`Reject::into_io`], if it is one.
    pub fn from_io(e: &std::io::Error) -> Option<Reject> {
        e.get_ref()?.downcast_ref::<Reject>().copied()
    }
}

impl fmt::Display for Reject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::error::Error for Reject {}

/// Handle to one shard's byte budget. Cloning is an `Rc` clone.
#[derive(Clone)]
pub struct Budget {
    pub(super) inner: Rc<BudgetInner>,
}

pub(super) struct BudgetInner {
    capacity: u64,
    max_in_flight: u32,
    used: Cell<u64>,
    peak: Cell<u64>,
    in_flight: Cell<u32>,
    /// Bytes of `used` held by open connections (`ConnCharge`), and how many hold them.
    conn_bytes: Cell<u64>,
    conns: Cell<u32>,
    /// Most bytes connections may hold before their first request passed the key check
    /// (`connection_share` of `capacity`; `charge_connection`).
    conn_limit: Cell<u64>,
    rejected: [Cell<u64>; Reject::COUNT],
    pub(super) queue: RefCell<WaitQueue>,
}

impl fmt::Debug for Budget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Budget")
            .field("capacity", &self.capacity())
            .field("used", &self.used())
            .field("connection_bytes", &self.connection_bytes())
            .field("in_flight", &self.in_flight())
            .field("queued", &self.queued())
            .finish()
    }
}

impl Budget {
    /// A budget of `capacity` bytes and `max_in_flight` permits, with a wait queue of at most
    /// `max_queue` waiters (used only by `acquire_or_wait`).
    pub fn new(capacity: u64, max_in_flight: u32, max_queue: u32) -> Budget {
        Budget {
            inner: Rc::new(BudgetInner {
                capacity,
                max_in_flight,
                used: Cell::new(0),
                peak: Cell::new(0),
                in_flight: Cell::new(0),
                conn_bytes: Cell::new(0),
                conns: Cell::new(0),
                conn_limit: Cell::new(capacity),
                rejected: Default::default(),
                queue: RefCell::new(WaitQueue::new(max_queue as usize)),
            }),
        }
    }

    /// Total bytes of this shard's budget.
    pub fn capacity(&self) -> u64 {
        self.inner.capacity
    }

    /// Bytes currently held by permits (including waiters granted but not yet resumed) and by
    /// open connections.
    pub fn used(&self) -> u64 {
        self.inner.used.get()
    }

    /// Bytes of [`Budget::used`] held by open connections (`ConnCharge`s).
    pub fn connection_bytes(&self) -> u64 {
        self.inner.conn_bytes.get()
    }

    /// Most bytes [`Budget::charge_connection`] lets connections hold (default: `capacity`).
    pub fn connection_limit(&self) -> u64 {
        self.inner.conn_limit.get()
    }

    /// Connections may hold at most `percent` % of the capacity through
    /// [`Budget::charge_connection`]; the rest stays for requests (and for connections whose
    /// request passed the key check, `charge_keyed_connection`).
    pub fn set_connection_share(&self, percent: u64) {
        let c = self.inner.capacity;
        self.inner
            .conn_limit
            .set((c / 100).saturating_mul(percent.min(100)) + c % 100 * percent.min(100) / 100);
    }

    /// Open connections holding a `ConnCharge`.
    pub fn connections(&self) -> u32 {
        self.inner.conns.get()
    }

    pub(super) fn add_connection(&self, bytes: u64) {
        let i = &self.inner;
        i.conn_bytes.set(i.conn_bytes.get().saturating_add(bytes));
        i.conns.set(i.conns.get().saturating_add(1));
    }

    pub(super) fn remove_connection(&self, bytes: u64) {
        let i = &self.inner;
        i.conn_bytes.set(i.conn_bytes.get().saturating_sub(bytes));
        i.conns.set(i.conns.get().saturating_sub(1));
    }

    /// `capacity - used`.
    pub fn available(&self) -> u64 {
        self.inner.capacity.saturating_sub(self.inner.used.get())
    }

    /// Highest `used` seen since creation or the last [`Budget::reset_peak`].
    pub fn peak(&self) -> u64 {
        self.inner.peak.get()
    }

    /// Resets the peak to the current `used`.
    pub fn reset_peak(&self) {
        self.inner.peak.set(self.inner.used.get());
    }

    /// Permits currently out.
    pub fn in_flight(&self) -> u32 {
        self.inner.in_flight.get()
    }

    /// Maximum permits out at once.
    pub fn max_in_flight(&self) -> u32 {
        self.inner.max_in_flight
    }

    /// Waiters currently queued (block mode).
    pub fn queued(&self) -> usize {
        self.inner.queue.try_borrow().map_or(0, |q| q.len())
    }

    /// Maximum queued waiters.
    pub fn max_queue(&self) -> usize {
        self.inner.queue.try_borrow().map_or(0, |q| q.max_len())
    }

    /// Rejections counted for `reason`.
    pub fn rejections(&self, reason: Reject) -> u64 {
        self.inner.rejected[reason.index()].get()
    }

    /// All rejection counters, indexed by [`Reject::index`].
    pub fn rejections_all(&self) -> [u64; Reject::COUNT] {
        let mut out = [0u64; Reject::COUNT];
        for (o, c) in out.iter_mut().zip(self.inner.rejected.iter()) {
            *o = c.get();
        }
        out
    }

    /// Counts one rejection. `try_acquire`, `acquire_or_wait` and `Permit::grow` count their own;
    /// callers use this for reasons decided elsewhere (e.g. `BodyTooLarge`).
    pub fn record_rejection(&self, reason: Reject) {
        let c = &self.inner.rejected[reason.index()];
        c.set(c.get().saturating_add(1));
    }

    /// Takes `bytes` and one in-flight slot now, or says why not (and counts the rejection).
    ///
    /// Strict FIFO: while waiters are queued (block mode), this refuses even if the bytes would
    /// fit, so it never overtakes them.
    pub fn try_acquire(&self, bytes: u64) -> Result<Permit, Reject> {
        let r = self.check(bytes).and_then(|()| {
            if self.queued() > 0 {
                Err(self.blocked_reason())
            } else {
                Ok(())
            }
        });
        match r {
            Ok(()) => {
                self.take(bytes);
                Ok(Permit::new(self.clone(), bytes))
            }
            Err(reason) => {
                self.record_rejection(reason);
                Err(reason)
            }
        }
    }

    /// Whether `bytes` plus one slot fit right now (ignores the queue; counts nothing).
    pub(super) fn check(&self, bytes: u64) -> Result<(), Reject> {
        if self.inner.in_flight.get() >= self.inner.max_in_flight {
            return Err(Reject::InFlight);
        }
        if bytes > self.available() {
            return Err(Reject::Budget);
        }
        Ok(())
    }

    /// The reason a newcomer is held back behind queued waiters.
    fn blocked_reason(&self) -> Reject {
        if self.inner.in_flight.get() >= self.inner.max_in_flight {
            Reject::InFlight
        } else {
            Reject::Budget
        }
    }

    /// Takes `bytes` and one slot; the caller has checked they fit.
    pub(super) fn take(&self, bytes: u64) {
        let used = self.inner.used.get().saturating_add(bytes);
        self.inner.used.set(used);
        self.inner
            .in_flight
            .set(self.inner.in_flight.get().saturating_add(1));
        self.bump_peak(used);
    }

    /// Adds `extra` bytes to an existing holder, without a slot and without regard to the queue
    /// (a running request growing its stream buffers must not wait behind new arrivals).
    pub(super) fn try_grow(&self, extra: u64) -> Result<(), Reject> {
        if extra > self.available() {
            self.record_rejection(Reject::Budget);
            return Err(Reject::Budget);
        }
        let used = self.inner.used.get() + extra;
        self.inner.used.set(used);
        self.bump_peak(used);
        Ok(())
    }

    /// Returns `bytes` and `slots` in-flight slots, then serves queued waiters that now fit.
    pub(super) fn release(&self, bytes: u64, slots: u32) {
        self.inner
            .used
            .set(self.inner.used.get().saturating_sub(bytes));
        self.inner
            .in_flight
            .set(self.inner.in_flight.get().saturating_sub(slots));
        if bytes > 0 || slots > 0 {
            self.pump();
        }
    }

    /// Holds `bytes` for a holder that outlives requests (the response cache), without a slot,
    /// only while at least `keep_free` bytes stay available after it; false otherwise (the
    /// holder skips or evicts: it never takes what requests need).
    pub fn try_hold(&self, bytes: u64, keep_free: u64) -> bool {
        if bytes.saturating_add(keep_free) > self.available() {
            return false;
        }
        let used = self.inner.used.get().saturating_add(bytes);
        self.inner.used.set(used);
        self.bump_peak(used);
        true
    }

    /// Returns bytes taken by [`Budget::try_hold`].
    pub fn release_hold(&self, bytes: u64) {
        self.release(bytes, 0);
    }

    fn bump_peak(&self, used: u64) {
        if used > self.inner.peak.get() {
            self.inner.peak.set(used);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acquire_and_release() {
        let b = Budget::new(1000, 2, 0);
        let p = b.try_acquire(600).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((b.used(), b.in_flight(), b.available()), (600, 1, 400));
        assert_eq!(b.try_acquire(401).err(), Some(Reject::Budget));
        let q = b.try_acquire(400).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(b.used(), 1000);
        assert_eq!(b.try_acquire(0).err(), Some(Reject::InFlight));
        drop(p);
        drop(q);
        assert_eq!((b.used(), b.in_flight(), b.peak()), (0, 0, 1000));
        assert_eq!(b.rejections(Reject::Budget), 1);
        assert_eq!(b.rejections(Reject::InFlight), 1);
        assert_eq!(b.rejections_all(), [1, 1, 0, 0, 0]);
        b.reset_peak();
        assert_eq!(b.peak(), 0);
    }

    #[test]
    fn larger_than_capacity_is_budget() {
        let b = Budget::new(10, 5, 0);
        assert_eq!(b.try_acquire(11).err(), Some(Reject::Budget));
        assert_eq!(b.used(), 0);
    }

    #[test]
    fn labels_and_indices() {
        for (i, r) in Reject::ALL.iter().enumerate() {
            assert_eq!(r.index(), i);
            assert_eq!(r.to_string(), r.as_str());
        }
        assert_eq!(Reject::BodyTooLarge.http_status(), 413);
        assert_eq!(Reject::QueueFull.http_status(), 503);
        let e = Reject::InFlight.into_io();
        assert_eq!(e.kind(), std::io::ErrorKind::OutOfMemory);
        assert_eq!(Reject::from_io(&e), Some(Reject::InFlight));
        assert_eq!(Reject::from_io(&std::io::Error::other("x")), None);
    }

    #[test]
    fn record_rejection_counts() {
        let b = Budget::new(10, 5, 0);
        b.record_rejection(Reject::BodyTooLarge);
        b.record_rejection(Reject::BodyTooLarge);
        assert_eq!(b.rejections(Reject::BodyTooLarge), 2);
        assert!(format!("{b:?}").contains("capacity: 10"));
    }
}
