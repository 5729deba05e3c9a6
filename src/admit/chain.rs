//! `ChunkChain`: a request or response body stored as a list of fixed-size pool chunks.
//!
//! Owns: appending bytes (copying, `push_bytes`, or reading straight from a socket, `read_from`)
//! into chunks charged to one permit, and reading the body back as slices.
//! Must not: reallocate body bytes (chunks are fixed; only the small list of chunk handles
//! grows), take a chunk without charging it, or read past the limit the caller gives (the bytes
//! after a body belong to the next pipelined request).

use std::fmt;
use std::io;
use std::rc::Rc;

use monoio::buf::SliceMut;
use monoio::io::AsyncReadRent;

use super::budget::Reject;
use super::permit::{Account, Charge};
use super::pool::{Chunk, ChunkPool};

/// A body as a list of pool chunks, charged to the permit it was created from
/// (`ChunkPool::chain(&permit)`). It keeps that permit's account alive until dropped.
pub struct ChunkChain {
    pool: ChunkPool,
    account: Rc<Account>,
    chunks: Vec<Chunk>,
    len: usize,
    broken: bool,
}

impl ChunkChain {
    pub(super) fn new(pool: ChunkPool, account: Rc<Account>) -> ChunkChain {
        ChunkChain {
            pool,
            account,
            chunks: Vec::new(),
            len: 0,
            broken: false,
        }
    }

    /// Appends `data`, taking new chunks as needed. All-or-nothing: if the permit cannot cover
    /// the new chunks (`Reject::Budget`, counted), nothing is appended.
    pub fn push_bytes(&mut self, data: &[u8]) -> Result<(), Reject> {
        let mut rest = data;
        if let Some(last) = self.chunks.last_mut() {
            let n = last.fill(rest);
            rest = &rest[n..];
            self.len += n;
        }
        if rest.is_empty() {
            return Ok(());
        }
        let cs = self.pool.chunk_size();
        let needed = rest.len().div_ceil(cs);
        // Reserve for all new chunks first, so a failure only has the tail fill to undo.
        if let Err(e) = self.account.ensure_uncommitted((needed * cs) as u64) {
            self.undo_tail_fill(data.len() - rest.len());
            return Err(e);
        }
        self.chunks.reserve(needed);
        while !rest.is_empty() {
            // Cannot fail after ensure_uncommitted; handled anyway, without panicking.
            let charge = Charge::new(&self.account, cs as u64)?;
            let mut chunk = self.pool.alloc_charged(charge);
            let n = chunk.fill(rest);
            rest = &rest[n..];
            self.len += n;
            self.chunks.push(chunk);
        }
        Ok(())
    }

    fn undo_tail_fill(&mut self, n: usize) {
        if let Some(last) = self.chunks.last_mut() {
            let keep = last.len().saturating_sub(n);
            last.truncate(keep);
            self.len = self.len.saturating_sub(n);
        }
    }

    /// One read from `reader` straight into the chain's tail chunk (no copy), at most `max`
    /// bytes (pass the body bytes still expected). Takes a new charged chunk when the tail is
    /// full. Returns the bytes read; `Ok(0)` means EOF (or `max == 0`).
    ///
    /// Errors: the reader's I/O error; `ErrorKind::OutOfMemory` wrapping a [`Reject`] when the
    /// permit cannot cover a new chunk (see [`Reject::from_io`]).
    ///
    /// Cancel safety: if this future is dropped mid-read, the tail chunk and its bytes are lost;
    /// the chain is then [`ChunkChain::is_broken`] and every later read fails. Discard it.
    pub async fn read_from<R: AsyncReadRent>(
        &mut self,
        reader: &mut R,
        max: usize,
    ) -> io::Result<usize> {
        if max == 0 {
            return Ok(0);
        }
        if self.broken {
            return Err(io::Error::other("chunk chain broken by a cancelled read"));
        }
        if self.chunks.last().is_none_or(|c| c.remaining() == 0) {
            let c = self
                .pool
                .alloc_for(&self.account)
                .map_err(Reject::into_io)?;
            self.chunks.push(c);
        }
        let Some(mut tail) = self.chunks.pop() else {
            return Err(io::Error::other("chunk chain has no tail"));
        };
        let room = tail.remaining().min(max);
        self.len -= tail.len();
        self.broken = true;
        let buf = tail.take_buf();
        let start = buf.len();
        // start <= len and start + room <= chunk_size <= capacity: SliceMut's checks hold.
        let (res, slice) = reader.read(SliceMut::new(buf, start, start + room)).await;
        tail.put_buf(slice.into_inner());
        self.len += tail.len();
        self.chunks.push(tail);
        self.broken = false;
        res
    }

    /// Whether a cancelled [`ChunkChain::read_from`] lost bytes (the chain must be discarded).
    pub fn is_broken(&self) -> bool {
        self.broken
    }

    /// Total bytes stored.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no bytes are stored.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Number of chunks held.
    pub fn chunk_count(&self) -> usize {
        self.chunks.len()
    }

    /// Bytes charged to the permit for this chain (`chunk_count * chunk_size`).
    pub fn charged_bytes(&self) -> u64 {
        (self.chunks.len() * self.pool.chunk_size()) as u64
    }

    /// The stored bytes, chunk by chunk (each slice non-empty except possibly a fresh tail).
    pub fn iter(&self) -> impl Iterator<Item = &[u8]> + '_ {
        self.chunks.iter().map(Chunk::as_slice)
    }

    /// A contiguous copy (allocates outside the budget; for tests, logging and small bodies).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.len);
        for s in self.iter() {
            v.extend_from_slice(s);
        }
        v
    }

    /// Drops all chunks (back to the pool, un-charged), keeping the chain usable.
    pub fn clear(&mut self) {
        self.chunks.clear();
        self.len = 0;
        self.broken = false;
    }
}

impl fmt::Debug for ChunkChain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChunkChain")
            .field("len", &self.len)
            .field("chunks", &self.chunks.len())
            .field("broken", &self.broken)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admit::budget::Budget;
    use crate::admit::permit::Permit;
    use crate::admit::tests::rt;
    use monoio::io::AsyncWriteRentExt;
    use monoio::net::UnixStream;
    use std::time::Duration;

    /// A budget of `capacity` bytes (10 in flight, no queue), a pool of 16-byte chunks (4
    /// kept free) and a permit that reserved `reserve` bytes.
    fn reserved(capacity: u64, reserve: u64) -> (Budget, ChunkPool, Permit) {
        let b = Budget::new(capacity, 10, 0);
        let p = b.try_acquire(reserve).unwrap();
        (b, ChunkPool::new(16, 4), p)
    }

    #[test]
    fn chain_stores_and_charges() {
        let (b, pool, p) = reserved(1 << 20, 40);
        let mut c = pool.chain(&p);
        assert!(c.is_empty());
        c.push_bytes(b"hello ").unwrap();
        c.push_bytes(b"world, this is a chunked body!").unwrap();
        let want = b"hello world, this is a chunked body!";
        assert_eq!(c.len(), want.len());
        assert_eq!(c.to_vec(), want.to_vec());
        assert_eq!(c.chunk_count(), 3);
        assert_eq!(c.charged_bytes(), 48);
        assert!(c.iter().all(|s| s.len() <= 16));
        // 40 reserved, 48 committed: grew by 8.
        assert_eq!((p.bytes(), p.committed(), b.used()), (48, 48, 48));
        assert_eq!(pool.stats().live, 3);
        drop(c);
        assert_eq!(
            (p.committed(), pool.stats().live, pool.stats().free),
            (0, 0, 3)
        );
        drop(p);
        assert_eq!((b.used(), b.in_flight()), (0, 0));
    }

    #[test]
    fn chain_push_is_all_or_nothing() {
        let (b, pool, p) = reserved(100, 20);
        let mut c = pool.chain(&p);
        c.push_bytes(&[1u8; 10]).unwrap();
        assert_eq!(c.push_bytes(&[2u8; 200]), Err(Reject::Budget));
        assert_eq!(c.to_vec(), vec![1u8; 10]);
        assert_eq!((c.chunk_count(), p.committed()), (1, 16));
        c.push_bytes(&[3u8; 30]).unwrap();
        assert_eq!(c.len(), 40);
        assert_eq!((b.used(), p.bytes(), p.committed()), (48, 48, 48));
        c.clear();
        assert_eq!((c.len(), p.committed()), (0, 0));
        assert!(format!("{c:?}").contains("len: 0"));
    }

    #[test]
    fn read_from_socket_respects_max_and_budget() {
        rt().block_on(async {
            let (b, pool, p) = reserved(64, 0);
            let (mut tx, mut rx) = UnixStream::pair().unwrap();
            let msg: Vec<u8> = (0..100u8).collect();
            let (r, _) = tx.write_all(msg[5..].to_vec()).await; // the rest is on the wire
            r.unwrap();
            let mut c = pool.chain(&p);
            c.push_bytes(&msg[..5]).unwrap(); // e.g. body bytes that came with the head
            let mut body_left = 45usize; // the body is 50 bytes; the rest is the next request
            while body_left > 0 {
                let n = c.read_from(&mut rx, body_left).await.unwrap();
                assert!(n > 0);
                body_left -= n;
            }
            assert_eq!(c.to_vec(), msg[..50].to_vec());
            assert_eq!(c.chunk_count(), 4);
            assert_eq!(p.committed(), 64);
            // The budget (64) is exhausted: the next read needs a new chunk and is refused.
            let mut c2 = pool.chain(&p);
            let e = c2.read_from(&mut rx, 10).await.unwrap_err();
            assert_eq!(Reject::from_io(&e), Some(Reject::Budget));
            assert_eq!(c.read_from(&mut rx, 0).await.unwrap(), 0);
            drop((c, c2));
            // The bytes after the body are still in the socket for the next request.
            let mut rest = pool.chain(&p);
            let n = rest.read_from(&mut rx, 100).await.unwrap();
            assert_eq!(rest.to_vec(), msg[50..50 + n].to_vec());
            drop(tx);
            drop(rest);
            drop(p);
            assert_eq!((b.used(), b.in_flight(), pool.stats().live), (0, 0, 0));
        });
    }

    #[test]
    fn cancelled_read_breaks_chain_but_returns_bytes() {
        rt().block_on(async {
            let (b, pool, p) = reserved(1000, 0);
            let (tx, mut rx) = UnixStream::pair().unwrap();
            let mut c = pool.chain(&p);
            c.push_bytes(b"abc").unwrap();
            let r =
                monoio::time::timeout(Duration::from_millis(20), c.read_from(&mut rx, 10)).await;
            assert!(r.is_err());
            assert!(c.is_broken());
            assert!(c.read_from(&mut rx, 10).await.is_err());
            assert_eq!(c.len(), 0);
            // The lent buffer is not recycled; the chunk's charge is gone.
            assert_eq!((p.committed(), pool.stats().live), (0, 0));
            c.clear();
            assert!(!c.is_broken());
            drop((c, tx, p));
            assert_eq!((b.used(), b.in_flight()), (0, 0));
        });
    }
}
