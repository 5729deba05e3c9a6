//! An in-memory, one-way, bounded byte pipe with monoio's owned-buffer read/write traits. The
//! in-process mock provider writes a complete HTTP response into a [`PipeWriter`] from its own
//! task, and the upstream [`Exchange`](super::Exchange) reads the [`PipeReader`] exactly as it
//! reads a socket: same framing, same timeouts, same relay and translation downstream.
//!
//! Owns: the pipe's buffer, its capacity bound (a writer waits while the pipe is full, so a
//! slow client back-pressures the mock like a socket would) and its close semantics (reader
//! gone → the writer gets `BrokenPipe`; writer gone → the reader gets EOF after the bytes).
//! Must not: know HTTP, or be shared across threads (`Rc`, `!Send`).
//!
//! **This is the crate's one module with `unsafe` code.** monoio's `IoBuf`/`IoBufMut` traits
//! hand out raw pointers; copying from/to them needs `unsafe`. Each block carries a `SAFETY:`
//! note; nothing else in the crate may use `unsafe` (`lib.rs` denies it everywhere else).
#![allow(unsafe_code)]

use std::cell::RefCell;
use std::collections::VecDeque;
use std::future::poll_fn;
use std::io;
use std::rc::Rc;
use std::task::{Poll, Waker};

use monoio::buf::{IoBuf, IoBufMut, IoVecBuf, IoVecBufMut};
use monoio::io::{AsyncReadRent, AsyncWriteRent};
use monoio::BufResult;

struct State {
    buf: VecDeque<u8>,
    cap: usize,
    writer_gone: bool,
    reader_gone: bool,
    reader: Option<Waker>,
    writer: Option<Waker>,
}

impl State {
    fn wake_reader(&mut self) {
        if let Some(w) = self.reader.take() {
            w.wake();
        }
    }
    fn wake_writer(&mut self) {
        if let Some(w) = self.writer.take() {
            w.wake();
        }
    }
}

/// The writing end (held by the producer task).
pub struct PipeWriter(Rc<RefCell<State>>);
/// The reading end (held by the exchange).
pub struct PipeReader(Rc<RefCell<State>>);

/// A pipe holding at most `cap` unread bytes (at least 1).
pub fn pipe(cap: usize) -> (PipeWriter, PipeReader) {
    let st = Rc::new(RefCell::new(State {
        buf: VecDeque::new(),
        cap: cap.max(1),
        writer_gone: false,
        reader_gone: false,
        reader: None,
        writer: None,
    }));
    (PipeWriter(st.clone()), PipeReader(st))
}

impl Drop for PipeWriter {
    fn drop(&mut self) {
        let mut st = self.0.borrow_mut();
        st.writer_gone = true;
        st.wake_reader();
    }
}

impl Drop for PipeReader {
    fn drop(&mut self) {
        let mut st = self.0.borrow_mut();
        st.reader_gone = true;
        st.buf = VecDeque::new();
        st.wake_writer();
    }
}

impl PipeWriter {
    /// Append as much of `data` as fits, waiting while the pipe is full. Returns the count.
    async fn put(&mut self, data: &[u8]) -> io::Result<usize> {
        if data.is_empty() {
            return Ok(0);
        }
        poll_fn(|cx| {
            let mut st = self.0.borrow_mut();
            if st.reader_gone {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::BrokenPipe,
                    "pipe reader gone",
                )));
            }
            let room = st.cap.saturating_sub(st.buf.len());
            if room == 0 {
                st.writer = Some(cx.waker().clone());
                return Poll::Pending;
            }
            let n = room.min(data.len());
            st.buf.extend(&data[..n]);
            st.wake_reader();
            Poll::Ready(Ok(n))
        })
        .await
    }
}

impl PipeReader {
    /// Wait for bytes (or the writer's end) and move up to `max` of them out with `take`.
    async fn get(&mut self, max: usize, mut take: impl FnMut(&[u8]) -> usize) -> io::Result<usize> {
        if max == 0 {
            return Ok(0);
        }
        poll_fn(|cx| {
            let mut st = self.0.borrow_mut();
            if st.buf.is_empty() {
                if st.writer_gone {
                    return Poll::Ready(Ok(0));
                }
                st.reader = Some(cx.waker().clone());
                return Poll::Pending;
            }
            let (front, _) = st.buf.as_slices();
            let n = take(&front[..front.len().min(max)]);
            st.buf.drain(..n);
            st.wake_writer();
            Poll::Ready(Ok(n))
        })
        .await
    }
}

impl AsyncWriteRent for PipeWriter {
    async fn write<T: IoBuf>(&mut self, buf: T) -> BufResult<usize, T> {
        // SAFETY: the `IoBuf` contract (an `unsafe trait`) guarantees `read_ptr` is valid for
        // `bytes_init` initialised bytes while `buf` is alive and not moved; `buf` is owned
        // here and outlives the slice, which is not kept past `put`.
        let data = unsafe { std::slice::from_raw_parts(buf.read_ptr(), buf.bytes_init()) };
        let r = self.put(data).await;
        (r, buf)
    }

    async fn writev<T: IoVecBuf>(&mut self, buf: T) -> BufResult<usize, T> {
        (
            Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "vectored writes are not used on pipes",
            )),
            buf,
        )
    }

    async fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }

    async fn shutdown(&mut self) -> io::Result<()> {
        let mut st = self.0.borrow_mut();
        st.writer_gone = true;
        st.wake_reader();
        Ok(())
    }
}

impl AsyncReadRent for PipeReader {
    async fn read<T: IoBufMut>(&mut self, mut buf: T) -> BufResult<usize, T> {
        let ptr = buf.write_ptr();
        let total = buf.bytes_total();
        let r = self
            .get(total, |src| {
                // SAFETY: `IoBufMut` guarantees `write_ptr` is valid for writes of
                // `bytes_total` bytes; `src.len() <= total` (get caps it at `max = total`),
                // and `src` (the pipe's own buffer) cannot overlap the caller's buffer.
                unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), ptr, src.len()) };
                src.len()
            })
            .await;
        if let Ok(n) = r {
            // SAFETY: the first `n` bytes at `write_ptr` were just initialised by the copy.
            unsafe { buf.set_init(n) };
        }
        (r, buf)
    }

    async fn readv<T: IoVecBufMut>(&mut self, buf: T) -> BufResult<usize, T> {
        (
            Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "vectored reads are not used on pipes",
            )),
            buf,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::io::{read_more, write_all};
    use std::time::{Duration, Instant};

    #[monoio::test(enable_timer = true)]
    async fn bytes_arrive_in_order_with_back_pressure() {
        let (mut w, mut r) = pipe(7);
        let data: Vec<u8> = (0..=255u8).cycle().take(10_000).collect();
        let expect = data.clone();
        let writer = monoio::spawn(async move {
            let (res, _) = write_all(&mut w, data).await;
            res
        });
        let mut got = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let n = read_more(&mut r, &mut got, deadline).await.unwrap();
            if n == 0 {
                break;
            }
            assert!(n <= 7, "a read never exceeds the pipe's capacity");
        }
        assert_eq!(got, expect);
        writer.await.unwrap();
    }

    #[monoio::test(enable_timer = true)]
    async fn reader_gone_breaks_the_writer() {
        let (mut w, r) = pipe(4);
        drop(r);
        let (res, _) = write_all(&mut w, b"hello".to_vec()).await;
        assert_eq!(res.unwrap_err().kind(), io::ErrorKind::BrokenPipe);
    }
}
