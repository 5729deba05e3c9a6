//! A `Permit`: one request's claim on the shard budget — N bytes plus one in-flight slot.
//!
//! Owns: the per-request account (`reserved` bytes taken from the budget, `committed` bytes of
//! those currently backing live pool chunks) and giving it all back exactly once, on drop — on
//! every path: normal completion, `?` errors, future cancellation, panic unwinding.
//! Must not: be sent across threads or shards, hand bytes to another request, or block/wait
//! (growth either fits now or fails).
//!
//! Lifetime rule: chunks allocated against a permit keep its account alive, so the bytes (and the
//! slot) come back when the `Permit` *and* every `Chunk`/`ChunkChain` charged to it are dropped.
//! Memory is released to the budget only when it is really free.

use std::cell::Cell;
use std::fmt;
use std::rc::Rc;

use super::budget::{Budget, Reject};

/// One request's reservation: bytes of the shard budget plus one in-flight slot.
///
/// Not `Clone`. Dropping it returns everything (see the module docs for chunk lifetimes).
pub struct Permit {
    account: Rc<Account>,
}

/// The shared account behind a permit; chunks hold an `Rc` to it through [`Charge`].
pub(super) struct Account {
    budget: Budget,
    /// Bytes taken from the budget on behalf of this request.
    reserved: Cell<u64>,
    /// Bytes of `reserved` currently backing live chunks (`committed <= reserved`).
    committed: Cell<u64>,
}

impl Permit {
    /// Wraps bytes and a slot that were already taken from `budget`.
    pub(super) fn new(budget: Budget, bytes: u64) -> Permit {
        Permit {
            account: Rc::new(Account {
                budget,
                reserved: Cell::new(bytes),
                committed: Cell::new(0),
            }),
        }
    }

    /// Bytes this permit holds in the budget.
    pub fn bytes(&self) -> u64 {
        self.account.reserved.get()
    }

    /// Bytes of [`Permit::bytes`] currently backing live pool chunks.
    pub fn committed(&self) -> u64 {
        self.account.committed.get()
    }

    /// Bytes held but not backing chunks (`bytes - committed`): room for more chunks or for
    /// buffers the caller accounts for itself.
    pub fn uncommitted(&self) -> u64 {
        self.account.uncommitted()
    }

    /// Takes `extra` more bytes from the budget for this request, now or never (no queueing; it
    /// does not wait behind queued newcomers). A failure is counted as a `budget` rejection.
    pub fn grow(&self, extra: u64) -> Result<(), Reject> {
        self.account.grow(extra)
    }

    /// Charges the growth of a plain buffer: grows this permit so that `charged` covers
    /// `buf`'s capacity (what the allocator holds). Call after each append; `charged` starts at 0
    /// and is what to `shrink` when the buffer is freed.
    pub fn charge_capacity(&self, buf: &Vec<u8>, charged: &mut u64) -> Result<(), Reject> {
        let want = buf.capacity() as u64;
        if want > *charged {
            self.grow(want - *charged)?;
            *charged = want;
        }
        Ok(())
    }

    /// Gives back up to `n` uncommitted bytes (never bytes backing live chunks); returns how many
    /// were given back. Queued waiters that now fit are served.
    pub fn shrink(&self, n: u64) -> u64 {
        let a = &self.account;
        let give = n.min(a.uncommitted());
        if give > 0 {
            a.reserved.set(a.reserved.get() - give);
            a.budget.release(give, 0);
        }
        give
    }

    /// Makes sure at least `n` bytes are uncommitted, growing by the shortfall if needed.
    pub fn ensure_uncommitted(&self, n: u64) -> Result<(), Reject> {
        self.account.ensure_uncommitted(n)
    }

    /// The budget this permit draws from.
    pub fn budget(&self) -> &Budget {
        &self.account.budget
    }

    /// Commits `n` bytes to a new charge (growing the reservation if needed).
    pub(super) fn charge(&self, n: u64) -> Result<Charge, Reject> {
        Charge::new(&self.account, n)
    }

    pub(super) fn account(&self) -> &Rc<Account> {
        &self.account
    }
}

impl fmt::Debug for Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit")
            .field("bytes", &self.bytes())
            .field("committed", &self.committed())
            .finish()
    }
}

impl Account {
    fn uncommitted(&self) -> u64 {
        self.reserved.get().saturating_sub(self.committed.get())
    }

    fn grow(&self, extra: u64) -> Result<(), Reject> {
        if extra == 0 {
            return Ok(());
        }
        self.budget.try_grow(extra)?;
        self.reserved.set(self.reserved.get().saturating_add(extra));
        Ok(())
    }

    pub(super) fn ensure_uncommitted(&self, n: u64) -> Result<(), Reject> {
        let have = self.uncommitted();
        if n > have {
            self.grow(n - have)?;
        }
        Ok(())
    }
}

impl Drop for Account {
    fn drop(&mut self) {
        let bytes = self.reserved.replace(0);
        self.committed.set(0);
        self.budget.release(bytes, 1);
    }
}

/// `n` committed bytes of an account, released (uncommitted, still reserved) on drop.
/// Keeps the account — and so the permit's bytes and slot — alive while it exists.
pub(super) struct Charge {
    account: Rc<Account>,
    bytes: u64,
}

impl Charge {
    pub(super) fn new(account: &Rc<Account>, n: u64) -> Result<Charge, Reject> {
        account.ensure_uncommitted(n)?;
        account
            .committed
            .set(account.committed.get().saturating_add(n));
        Ok(Charge {
            account: Rc::clone(account),
            bytes: n,
        })
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        let c = &self.account.committed;
        c.set(c.get().saturating_sub(self.bytes));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grow_and_shrink() {
        let b = Budget::new(1000, 10, 0);
        let p = b.try_acquire(100).unwrap();
        p.grow(400).unwrap();
        assert_eq!((p.bytes(), b.used()), (500, 500));
        assert_eq!(p.grow(501), Err(Reject::Budget));
        assert_eq!(p.bytes(), 500);
        assert_eq!(b.rejections(Reject::Budget), 1);
        p.grow(500).unwrap();
        assert_eq!(b.used(), 1000);
        assert_eq!(b.peak(), 1000);
        assert_eq!(p.shrink(300), 300);
        assert_eq!(b.used(), 700);
        assert_eq!(p.shrink(10_000), 700);
        assert_eq!((p.bytes(), b.used(), b.in_flight()), (0, 0, 1));
        p.grow(0).unwrap();
        drop(p);
        assert_eq!((b.used(), b.in_flight()), (0, 0));
    }

    #[test]
    fn charges_use_reservation_first_and_pin_account() {
        let b = Budget::new(1000, 10, 0);
        let p = b.try_acquire(100).unwrap();
        let c1 = p.charge(60).unwrap();
        assert_eq!((p.bytes(), p.committed(), p.uncommitted()), (100, 60, 40));
        let c2 = p.charge(60).unwrap(); // grows by 20
        assert_eq!((p.bytes(), p.committed(), b.used()), (120, 120, 120));
        assert_eq!(p.shrink(50), 0, "cannot shrink committed bytes");
        drop(c1);
        assert_eq!(p.committed(), 60);
        assert_eq!(p.shrink(1000), 60);
        drop(p);
        // c2 still alive: bytes and slot still held.
        assert_eq!((b.used(), b.in_flight()), (60, 1));
        drop(c2);
        assert_eq!((b.used(), b.in_flight()), (0, 0));
    }

    #[test]
    fn charge_failure_leaves_state_unchanged() {
        let b = Budget::new(100, 10, 0);
        let p = b.try_acquire(50).unwrap();
        assert!(p.charge(200).is_err());
        assert_eq!((p.bytes(), p.committed(), b.used()), (50, 0, 50));
        p.ensure_uncommitted(80).unwrap();
        assert_eq!(p.bytes(), 80);
        assert!(format!("{p:?}").contains("bytes: 80"));
        assert_eq!(p.budget().used(), 80);
        assert_eq!(Rc::strong_count(p.account()), 1);
    }

    #[test]
    fn returned_on_panic_unwind() {
        let b = Budget::new(100, 10, 0);
        let b2 = b.clone();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
            let p = b2.try_acquire(70).unwrap();
            p.grow(10).unwrap();
            panic!("boom");
        }));
        assert!(r.is_err());
        assert_eq!((b.used(), b.in_flight()), (0, 0));
    }
}
