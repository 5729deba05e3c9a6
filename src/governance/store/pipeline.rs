//! One pipelined Redis connection on a shard's own runtime: any number of commands in flight,
//! their replies matched in order (Redis answers each connection in the order it was asked).
//!
//! A caller appends its encoded command to the output buffer and gets a `Slot` (or nothing,
//! for a command whose reply only matters if it is an error); the writer task sends whatever
//! has accumulated in one write, the reader task parses replies (`resp`) and fills the slots
//! front to back. Nothing blocks: a caller awaits its slot until its deadline (`Slot::until`;
//! what a late reply means for the connection is the caller's, see `Store`).
//!
//! When the connection fails (IO error, EOF, protocol error, or `fail` — e.g. a reply that
//! missed its deadline, after which the order can no longer be trusted to be cheap) every
//! waiting slot gets the fault at once and `serve` returns; the next connection starts with an
//! empty queue.
//!
//! Owns: `Pipeline`, `Slot`, `Fault`. Must not: know what the commands mean or decide policy
//! (retries, fallbacks: `Store`).

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::{poll_fn, Future};
use std::rc::Rc;
use std::task::{Poll, Waker};
use std::time::Instant;

use monoio::buf::IoBufMut;
use monoio::io::{AsyncReadRent, AsyncWriteRent, Split, Splitable};

use super::resp::{self, Reply};

/// Why a command got no reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Not connected (or not ready yet).
    Down,
    /// Connecting or the handshake failed.
    Connect,
    /// No reply within the deadline.
    Timeout,
    /// The connection broke (IO error, EOF).
    Io,
    /// The server sent something that is not a valid reply, or an error where none was
    /// acceptable.
    Reply,
}

impl Fault {
    pub fn as_str(self) -> &'static str {
        match self {
            Fault::Down => "down",
            Fault::Connect => "connect",
            Fault::Timeout => "timeout",
            Fault::Io => "io",
            Fault::Reply => "reply",
        }
    }
}

/// Where one reply goes.
#[derive(Default)]
pub struct Slot {
    reply: RefCell<Option<Result<Reply, Fault>>>,
    waker: Cell<Option<Waker>>,
}

impl Slot {
    fn fill(&self, r: Result<Reply, Fault>) {
        *self.reply.borrow_mut() = Some(r);
        if let Some(w) = self.waker.take() {
            w.wake();
        }
    }

    /// The reply if it arrives by `deadline` (`None`: it did not; the caller decides what a
    /// late reply costs the connection).
    pub async fn until(&self, deadline: Instant) -> Option<Result<Reply, Fault>> {
        let left = deadline.saturating_duration_since(Instant::now());
        monoio::time::timeout(left, self.wait()).await.ok()
    }

    /// The reply, once it arrived.
    pub fn wait(&self) -> impl Future<Output = Result<Reply, Fault>> + '_ {
        poll_fn(move |cx| match self.reply.borrow_mut().take() {
            Some(r) => Poll::Ready(r),
            None => {
                self.waker.set(Some(cx.waker().clone()));
                Poll::Pending
            }
        })
    }
}

/// A wake-up for one waiting task (set → the next `wait` returns at once).
#[derive(Default)]
pub struct Notify {
    set: Cell<bool>,
    waker: Cell<Option<Waker>>,
}

impl Notify {
    pub fn notify(&self) {
        self.set.set(true);
        if let Some(w) = self.waker.take() {
            w.wake();
        }
    }

    pub fn wait(&self) -> impl Future<Output = ()> + '_ {
        poll_fn(move |cx| {
            if self.set.replace(false) {
                Poll::Ready(())
            } else {
                self.waker.set(Some(cx.waker().clone()));
                Poll::Pending
            }
        })
    }
}

/// Replies waited for: a slot, or nothing (the reply is dropped; an error reply is counted).
enum Waiting {
    Slot(Rc<Slot>),
    Ignore,
}

/// Bytes of unparsed reply data the reader holds at most.
const MAX_UNPARSED: usize = 2 * resp::MAX_BULK;

#[derive(Default)]
pub struct Pipeline {
    out: RefCell<Vec<u8>>,
    waiting: RefCell<VecDeque<Waiting>>,
    /// Whether a connection is being served (commands may be queued).
    open: Cell<bool>,
    /// Whether there is output to write.
    wrote: Notify,
    /// `fail` was called: `serve` returns this.
    failed: Cell<Option<Fault>>,
    broke: Notify,
    /// Error replies to commands nobody waited for.
    pub ignored_errors: Cell<u64>,
}

impl Pipeline {
    /// Queue a command (`encode` appends it) whose reply goes to the returned slot.
    pub fn call(&self, encode: impl FnOnce(&mut Vec<u8>)) -> Result<Rc<Slot>, Fault> {
        if !self.open.get() {
            return Err(Fault::Down);
        }
        let slot = Rc::new(Slot::default());
        encode(&mut self.out.borrow_mut());
        self.waiting
            .borrow_mut()
            .push_back(Waiting::Slot(slot.clone()));
        self.wrote.notify();
        Ok(slot)
    }

    /// Queue a command whose reply is not waited for (an error reply is counted).
    pub fn send(&self, encode: impl FnOnce(&mut Vec<u8>)) -> bool {
        if !self.open.get() {
            return false;
        }
        encode(&mut self.out.borrow_mut());
        self.waiting.borrow_mut().push_back(Waiting::Ignore);
        self.wrote.notify();
        true
    }

    /// Give up on this connection: every waiting slot gets `fault`, `serve` returns.
    pub fn fail(&self, fault: Fault) {
        if !self.open.get() {
            return;
        }
        self.open.set(false);
        if self.failed.get().is_none() {
            self.failed.set(Some(fault));
        }
        self.out.borrow_mut().clear();
        let waiting: Vec<Waiting> = self.waiting.borrow_mut().drain(..).collect();
        for w in waiting {
            if let Waiting::Slot(s) = w {
                s.fill(Err(fault));
            }
        }
        self.broke.notify();
    }

    /// A new connection: commands may be queued from now on (`serve` sends them).
    pub fn start(&self) {
        self.failed.set(None);
        self.broke.set.set(false);
        self.out.borrow_mut().clear();
        self.waiting.borrow_mut().clear();
        self.open.set(true);
    }

    /// Serve `stream` (plain TCP or TLS, after `start`) until it fails; returns why.
    pub async fn serve<S: Split + AsyncReadRent + AsyncWriteRent>(&self, stream: S) -> Fault {
        let (mut rd, mut wr) = stream.into_split();
        let writing = async {
            let mut spare = Vec::new();
            loop {
                self.wrote.wait().await;
                let data = std::mem::replace(&mut *self.out.borrow_mut(), spare);
                let (res, back) = crate::http::io::write_all(&mut wr, data).await;
                spare = back;
                if res.is_err() {
                    return Fault::Io;
                }
            }
        };
        let reading = async {
            let mut buf: Vec<u8> = Vec::with_capacity(4096);
            loop {
                let mut used = 0;
                loop {
                    match resp::parse(&buf[used..]) {
                        Ok(Some((reply, n))) => {
                            used += n;
                            if let Err(f) = self.deliver(reply) {
                                return f;
                            }
                        }
                        Ok(None) => break,
                        Err(_) => return Fault::Reply,
                    }
                }
                buf.drain(..used);
                if buf.len() > MAX_UNPARSED {
                    return Fault::Reply;
                }
                if buf.capacity() - buf.len() < 1024 {
                    buf.reserve(4096);
                }
                let len = buf.len();
                let (res, slice) = rd.read(std::mem::take(&mut buf).slice_mut(len..)).await;
                buf = slice.into_inner();
                match res {
                    Ok(0) | Err(_) => return Fault::Io,
                    Ok(_) => {}
                }
            }
        };
        let fault = monoio::select! {
            f = writing => f,
            f = reading => f,
            _ = self.broke.wait() => self.failed.get().unwrap_or(Fault::Io),
        };
        self.fail(fault);
        self.failed.get().unwrap_or(fault)
    }

    /// Hand `reply` to the oldest waiting command.
    fn deliver(&self, reply: Reply) -> Result<(), Fault> {
        let next = self.waiting.borrow_mut().pop_front();
        match next {
            Some(Waiting::Slot(s)) => {
                s.fill(Ok(reply));
                Ok(())
            }
            Some(Waiting::Ignore) => {
                if let Some(e) = reply.error() {
                    crate::observe::metrics::bump(&self.ignored_errors);
                    // the script cache was flushed under us: the reply is lost, and so would
                    // be the next ones; reconnecting loads it again (and resyncs)
                    if e.starts_with(b"NOSCRIPT") {
                        return Err(Fault::Reply);
                    }
                }
                Ok(())
            }
            // a reply nobody asked for: the stream is out of step
            None => Err(Fault::Reply),
        }
    }

    /// Commands sent and not answered yet.
    pub fn in_flight(&self) -> usize {
        self.waiting.borrow().len()
    }
}
