//! Per-shard pool of fixed-size byte chunks (`ChunkPool`, `Chunk`).
//!
//! Owns: allocating chunks (reusing up to `max_free` retained free chunks), returning them on
//! drop, and charging every live chunk's full size to a [`Permit`] (also without the chunk's
//! buffer: `reserve`, for a holder that sizes its own buffer to what it holds).
//! Bodies made of chunks live in `chain.rs`.
//! Must not: reallocate a chunk (a chunk's buffer never grows past `chunk_size`), retain more
//! than `max_free` free chunks, hand out a chunk without a charge, or cross shards/threads.
//!
//! Accounting: a live chunk costs `chunk_size` bytes of its permit, taken from the permit's
//! uncommitted reservation first and by growing the permit for the shortfall. The retained free
//! list (at most `max_free * chunk_size` bytes) is fixed per-shard overhead, outside the budget.

use std::cell::{Cell, RefCell};
use std::fmt;
use std::rc::Rc;

use super::budget::Reject;
use super::chain::ChunkChain;
use super::permit::{Account, Charge, Permit};

/// Default chunk size: 16 KiB.
pub const DEFAULT_CHUNK_SIZE: usize = 16 << 10;

/// Handle to a shard's chunk pool. Cloning is an `Rc` clone.
#[derive(Clone)]
pub struct ChunkPool {
    inner: Rc<PoolInner>,
}

struct PoolInner {
    chunk_size: usize,
    max_free: usize,
    free: RefCell<Vec<Vec<u8>>>,
    live: Cell<usize>,
    allocated: Cell<u64>,
    reused: Cell<u64>,
}

/// A snapshot of pool counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Bytes per chunk.
    pub chunk_size: usize,
    /// Chunks currently handed out (and chunk-sized reservations, `ChunkPool::reserve`).
    pub live: usize,
    /// Free chunks retained for reuse.
    pub free: usize,
    /// Chunks allocated from the system since creation.
    pub allocated_total: u64,
    /// Chunk requests served from the free list since creation.
    pub reused_total: u64,
}

impl ChunkPool {
    /// A pool of `chunk_size`-byte chunks (at least 1) keeping at most `max_free` free chunks.
    pub fn new(chunk_size: usize, max_free: usize) -> ChunkPool {
        ChunkPool {
            inner: Rc::new(PoolInner {
                chunk_size: chunk_size.max(1),
                max_free,
                free: RefCell::new(Vec::new()),
                live: Cell::new(0),
                allocated: Cell::new(0),
                reused: Cell::new(0),
            }),
        }
    }

    /// Bytes per chunk.
    pub fn chunk_size(&self) -> usize {
        self.inner.chunk_size
    }

    /// Counters.
    pub fn stats(&self) -> PoolStats {
        PoolStats {
            chunk_size: self.inner.chunk_size,
            live: self.inner.live.get(),
            free: self.inner.free.try_borrow().map_or(0, |f| f.len()),
            allocated_total: self.inner.allocated.get(),
            reused_total: self.inner.reused.get(),
        }
    }

    /// Frees all retained free chunks (e.g. after a load spike).
    pub fn trim(&self) {
        if let Ok(mut f) = self.inner.free.try_borrow_mut() {
            f.clear();
            f.shrink_to_fit();
        }
    }

    /// One empty chunk charged to `permit` (`chunk_size` bytes).
    pub fn alloc(&self, permit: &Permit) -> Result<Chunk, Reject> {
        let charge = permit.charge(self.inner.chunk_size as u64)?;
        Ok(self.alloc_charged(charge))
    }

    /// A chunk's charge to `permit` without its buffer (`chunk_size` bytes, as [`ChunkPool::alloc`]
    /// charges): for a holder that allocates its own buffer, at most a chunk of it, only while
    /// bytes are in it (a stream's read buffer, `answer::stream`).
    pub fn reserve(&self, permit: &Permit) -> Result<Reserved, Reject> {
        let charge = permit.charge(self.inner.chunk_size as u64)?;
        let inner = &self.inner;
        inner.live.set(inner.live.get() + 1);
        Ok(Reserved {
            pool: Rc::clone(inner),
            _charge: charge,
        })
    }

    /// An empty body charged to `permit`.
    pub fn chain(&self, permit: &Permit) -> ChunkChain {
        ChunkChain::new(self.clone(), Rc::clone(permit.account()))
    }

    /// One empty chunk charged to `account` (growing its reservation if needed).
    pub(super) fn alloc_for(&self, account: &Rc<Account>) -> Result<Chunk, Reject> {
        let charge = Charge::new(account, self.inner.chunk_size as u64)?;
        Ok(self.alloc_charged(charge))
    }

    pub(super) fn alloc_charged(&self, charge: Charge) -> Chunk {
        let inner = &self.inner;
        let reused = inner.free.try_borrow_mut().ok().and_then(|mut f| f.pop());
        let buf = match reused {
            Some(b) => {
                inner.reused.set(inner.reused.get() + 1);
                b
            }
            None => {
                inner.allocated.set(inner.allocated.get() + 1);
                Vec::with_capacity(inner.chunk_size)
            }
        };
        inner.live.set(inner.live.get() + 1);
        Chunk {
            buf,
            pool: Rc::clone(inner),
            _charge: charge,
        }
    }
}

/// A chunk's worth of a permit's bytes held without a buffer ([`ChunkPool::reserve`]), counted
/// as a live chunk (`PoolStats::live`: what is charged, not what is allocated); given back
/// (uncommitted) on drop.
pub struct Reserved {
    pool: Rc<PoolInner>,
    _charge: Charge,
}

impl Drop for Reserved {
    fn drop(&mut self) {
        let p = &self.pool;
        p.live.set(p.live.get().saturating_sub(1));
    }
}

impl fmt::Debug for ChunkPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.stats(), f)
    }
}

/// A fixed-capacity buffer from a [`ChunkPool`]; goes back to the pool (and un-charges its
/// permit) on drop.
pub struct Chunk {
    buf: Vec<u8>,
    pool: Rc<PoolInner>,
    _charge: Charge,
}

impl Chunk {
    /// Bytes written.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// Whether nothing is written.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// Fixed capacity (the pool's chunk size).
    pub fn capacity(&self) -> usize {
        self.pool.chunk_size
    }

    /// Bytes that still fit. 0 for a chunk whose buffer was lost to a cancelled read.
    pub fn remaining(&self) -> usize {
        if self.buf.capacity() < self.pool.chunk_size {
            return 0;
        }
        self.pool.chunk_size.saturating_sub(self.buf.len())
    }

    /// Copies as much of `data` as fits; returns how many bytes were copied. Never reallocates.
    pub fn fill(&mut self, data: &[u8]) -> usize {
        let n = data.len().min(self.remaining());
        self.buf.extend_from_slice(&data[..n]);
        n
    }

    /// The written bytes.
    pub fn as_slice(&self) -> &[u8] {
        &self.buf
    }

    /// Forgets the written bytes (keeps the chunk and its charge).
    pub fn clear(&mut self) {
        self.buf.clear();
    }

    /// Keeps only the first `len` bytes.
    pub fn truncate(&mut self, len: usize) {
        self.buf.truncate(len);
    }

    /// Lends the buffer out for an owned-buffer read (monoio). Until [`Chunk::put_buf`], the
    /// chunk is empty with no room; if the buffer never comes back, the chunk is simply not
    /// recycled.
    pub(crate) fn take_buf(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.buf)
    }

    /// Returns a buffer lent by [`Chunk::take_buf`].
    pub(crate) fn put_buf(&mut self, buf: Vec<u8>) {
        self.buf = buf;
    }
}

impl fmt::Debug for Chunk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Chunk")
            .field("len", &self.len())
            .field("capacity", &self.capacity())
            .finish()
    }
}

impl Drop for Chunk {
    fn drop(&mut self) {
        let mut buf = std::mem::take(&mut self.buf);
        let p = &self.pool;
        p.live.set(p.live.get().saturating_sub(1));
        if let Ok(mut free) = p.free.try_borrow_mut() {
            if free.len() < p.max_free && buf.capacity() >= p.chunk_size {
                buf.clear();
                free.push(buf);
            }
        }
        // `_charge` drops after this, un-committing the chunk's bytes.
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admit::budget::Budget;

    #[test]
    fn pool_reuses_and_caps_free_list() {
        let b = Budget::new(1 << 20, 10, 0);
        let pool = ChunkPool::new(1024, 2);
        let p = b.try_acquire(0).unwrap();
        let chunks: Vec<Chunk> = (0..5).map(|_| pool.alloc(&p).unwrap()).collect();
        assert_eq!(p.committed(), 5 * 1024);
        drop(chunks);
        let s = pool.stats();
        assert_eq!(
            (s.live, s.free, s.allocated_total, s.reused_total),
            (0, 2, 5, 0)
        );
        let mut c = pool.alloc(&p).unwrap();
        assert_eq!(pool.stats().reused_total, 1);
        assert!(c.is_empty());
        assert_eq!(c.fill(&[7u8; 2000]), 1024);
        assert_eq!((c.len(), c.remaining(), c.capacity()), (1024, 0, 1024));
        assert_eq!(c.fill(b"x"), 0);
        c.clear();
        assert_eq!(c.remaining(), 1024);
        drop(c);
        pool.trim();
        assert_eq!(pool.stats().free, 0);
        assert!(format!("{pool:?}").contains("chunk_size: 1024"));
    }

    #[test]
    fn reserve_charges_a_chunk_without_a_buffer() {
        let b = Budget::new(1000, 10, 0);
        let pool = ChunkPool::new(600, 2);
        let p = b.try_acquire(0).unwrap();
        let r = pool.reserve(&p).unwrap();
        assert_eq!((p.committed(), pool.stats().live), (600, 1));
        assert_eq!(pool.stats().allocated_total, 0, "no buffer");
        assert_eq!(pool.reserve(&p).err(), Some(Reject::Budget));
        assert_eq!(pool.alloc(&p).err(), Some(Reject::Budget));
        drop(r);
        assert_eq!((p.committed(), pool.stats().live), (0, 0));
        assert!(pool.alloc(&p).is_ok());
    }

    #[test]
    fn chunk_alloc_fails_when_budget_exhausted() {
        let b = Budget::new(1000, 10, 0);
        let pool = ChunkPool::new(600, 2);
        let p = b.try_acquire(0).unwrap();
        let c = pool.alloc(&p).unwrap();
        assert_eq!(pool.alloc(&p).err(), Some(Reject::Budget));
        assert_eq!(pool.stats().live, 1);
        drop(p);
        assert_eq!(b.used(), 600, "live chunk keeps its bytes");
        drop(c);
        assert_eq!((b.used(), b.in_flight()), (0, 0));
    }
}
