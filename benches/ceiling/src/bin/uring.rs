//! The raw io_uring relay (issue 23's ceiling prototype): what a driver change could buy.
//! One thread, one ring (COOP_TASKRUN | SINGLE_ISSUER as the gateway's, `--defer` adds
//! DEFER_TASKRUN), and the operations monoio 0.2.4 does not expose:
//! - multishot accept straight into the registered file table (no fd, no per-accept SQE);
//! - multishot receive on every client connection from one provided-buffer ring (4,096 ×
//!   4 KiB shared by all connections: no buffer held by an idle connection);
//! - registered files for every socket (clients and upstreams);
//! - one send per message, straight from the provided buffer it arrived in when the whole
//!   message is in one buffer (else from an accumulated copy);
//! - the upstream read as a one-shot buffer-select receive with IORING_RECVSEND_POLL_FIRST,
//!   submitted with the request's send (the answer is never there yet: no speculative try).
//!
//! Upstream connections: `--pool N` made at start (blocking connect, then registered), handed
//! out per request and returned when the answer is complete. Prototype limits (not product
//! code): no timeouts, no retry, pool exhaustion closes the client, no EOF watch on idle
//! upstreams, Content-Length framing only (`ringgate_ceiling::frame`).

use io_uring::{cqueue, opcode, squeue, types, IoUring};
use ringgate_ceiling::{args, frame, Frame};
use std::alloc::{alloc_zeroed, Layout};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, IntoRawFd};
use std::sync::atomic::{AtomicU16, Ordering};

const BUF_SIZE: usize = 4096;
const BUF_COUNT: u16 = 4096; // a power of two
const BGID: u16 = 0;
const FILES: u32 = 16384;
const POLL_FIRST: u16 = 1; // IORING_RECVSEND_POLL_FIRST (not settable on Recv in io-uring 0.6)

const ACCEPT: u64 = 1;
const CRECV: u64 = 2;
const CSEND: u64 = 3;
const USEND: u64 = 4;
const URECV: u64 = 5;
const CLOSE: u64 = 6;

fn ud(kind: u64, idx: u32) -> u64 {
    kind << 32 | u64::from(idx)
}

/// The provided-buffer ring and the memory behind it.
struct Bufs {
    ring: *mut types::BufRingEntry,
    mem: Vec<u8>,
    tail: u16,
}

impl Bufs {
    fn new(sub: &io_uring::Submitter<'_>) -> std::io::Result<Self> {
        let layout = Layout::from_size_align(usize::from(BUF_COUNT) * 16, 4096).expect("layout");
        // SAFETY: non-zero size; the ring lives as long as the process (never freed).
        let ring = unsafe { alloc_zeroed(layout) } as *mut types::BufRingEntry;
        // SAFETY: `ring` is page aligned, BUF_COUNT entries, and outlives the registration.
        unsafe { sub.register_buf_ring(ring as u64, BUF_COUNT, BGID)? };
        let mut b = Bufs {
            ring,
            mem: vec![0u8; usize::from(BUF_COUNT) * BUF_SIZE],
            tail: 0,
        };
        for bid in 0..BUF_COUNT {
            b.push(bid);
        }
        Ok(b)
    }

    /// Give buffer `bid` back to the kernel.
    fn push(&mut self, bid: u16) {
        // SAFETY: the index is masked into the ring; addr/len/bid do not overlap the tail.
        unsafe {
            let e = &mut *self.ring.add(usize::from(self.tail & (BUF_COUNT - 1)));
            e.set_addr(self.ptr(bid) as u64);
            e.set_len(BUF_SIZE as u32);
            e.set_bid(bid);
            self.tail = self.tail.wrapping_add(1);
            let t = types::BufRingEntry::tail(self.ring) as *const AtomicU16;
            (*t).store(self.tail, Ordering::Release);
        }
    }

    fn ptr(&self, bid: u16) -> *const u8 {
        // SAFETY: bid < BUF_COUNT
        unsafe { self.mem.as_ptr().add(usize::from(bid) * BUF_SIZE) }
    }

    fn get(&self, bid: u16, len: usize) -> &[u8] {
        &self.mem[usize::from(bid) * BUF_SIZE..][..len]
    }
}

/// A message on its way out: in a provided buffer or an accumulated copy.
enum Data {
    Buf(u16),
    Vec(Vec<u8>),
}

struct Out {
    data: Data,
    off: usize,
    len: usize,
}

impl Out {
    fn ptr(&self, bufs: &Bufs) -> *const u8 {
        let base = match &self.data {
            Data::Buf(b) => bufs.ptr(*b),
            Data::Vec(v) => v.as_ptr(),
        };
        // SAFETY: off <= len <= the data's length
        unsafe { base.add(self.off) }
    }
}

#[derive(Default)]
struct Client {
    acc: Vec<u8>,
    up: Option<u32>,
    out: Option<Out>,
    eof: bool,
}

struct Up {
    slot: u32,
    client: Option<u32>,
    acc: Vec<u8>,
    out: Option<Out>,
    /// the answer is complete but the request's send has not reported yet: back to the
    /// pool on that report, not before (its buffer is still the kernel's)
    done: bool,
}

struct Relay {
    bufs: Bufs,
    clients: Vec<Option<Client>>,
    ups: Vec<Up>,
    idle: Vec<u32>,
    sqes: Vec<squeue::Entry>,
    lfd: i32,
    /// a closed client's send still in flight: its buffer, released on the send's report
    orphans: Vec<Option<Out>>,
}

fn with_ioprio(e: squeue::Entry, ioprio: u16) -> squeue::Entry {
    // SAFETY: squeue::Entry is repr(C) around io_uring_sqe (64 bytes); ioprio is the u16 at 2.
    unsafe {
        let mut raw: [u8; 64] = std::mem::transmute(e);
        raw[2..4].copy_from_slice(&ioprio.to_ne_bytes());
        std::mem::transmute(raw)
    }
}

impl Relay {
    fn release(&mut self, out: Option<Out>) {
        if let Some(Out {
            data: Data::Buf(b), ..
        }) = out
        {
            self.bufs.push(b);
        }
    }

    fn arm_accept(&mut self) {
        let e = opcode::AcceptMulti::new(types::Fd(self.lfd))
            .allocate_file_index(true)
            .build();
        self.sqes.push(e.user_data(ud(ACCEPT, 0)));
    }

    fn arm_client(&mut self, c: u32) {
        let e = opcode::RecvMulti::new(types::Fixed(c), BGID).build();
        self.sqes.push(e.user_data(ud(CRECV, c)));
    }

    fn arm_up(&mut self, u: u32, poll_first: bool) {
        let slot = self.ups[u as usize].slot;
        let e = opcode::Recv::new(types::Fixed(slot), std::ptr::null_mut(), BUF_SIZE as u32)
            .buf_group(BGID)
            .build()
            .flags(squeue::Flags::BUFFER_SELECT);
        let e = if poll_first {
            with_ioprio(e, POLL_FIRST)
        } else {
            e
        };
        self.sqes.push(e.user_data(ud(URECV, u)));
    }

    fn send(&mut self, fd: u32, out: &Out, kind: u64, idx: u32) {
        let e = opcode::Send::new(
            types::Fixed(fd),
            out.ptr(&self.bufs),
            (out.len - out.off) as u32,
        )
        .build();
        self.sqes.push(e.user_data(ud(kind, idx)));
    }

    fn close_client(&mut self, c: u32) {
        if let Some(cl) = self.clients[c as usize].take() {
            self.orphans[c as usize] = cl.out;
            if let Some(u) = cl.up {
                self.ups[u as usize].client = None;
            }
            self.sqes.push(
                opcode::Close::new(types::Fixed(c))
                    .build()
                    .user_data(ud(CLOSE, c)),
            );
        }
    }

    fn on(&mut self, user_data: u64, res: i32, flags: u32) {
        let (kind, idx) = (user_data >> 32, user_data as u32);
        match kind {
            ACCEPT => {
                if res >= 0 {
                    let c = res as u32;
                    self.clients[c as usize] = Some(Client::default());
                    self.arm_client(c);
                } else {
                    eprintln!("accept: {}", std::io::Error::from_raw_os_error(-res));
                }
                if !cqueue::more(flags) {
                    self.arm_accept();
                }
            }
            CRECV => self.client_recv(idx, res, flags),
            CSEND => self.client_sent(idx, res),
            USEND => self.up_sent(idx, res),
            URECV => self.up_recv(idx, res, flags),
            _ => {}
        }
    }

    fn client_recv(&mut self, c: u32, res: i32, flags: u32) {
        let more = cqueue::more(flags);
        let bid = cqueue::buffer_select(flags);
        if self.clients[c as usize].is_none() {
            if let Some(b) = bid {
                self.bufs.push(b);
            }
            return;
        }
        if res == -libc::ENOBUFS {
            if !more {
                self.arm_client(c);
            }
            return;
        }
        if res <= 0 {
            let cl = self.clients[c as usize].as_mut().expect("client");
            cl.eof = true;
            if cl.up.is_none() && cl.out.is_none() {
                self.close_client(c);
            }
            return;
        }
        let (n, bid) = (res as usize, bid.expect("buffer id"));
        let cl = self.clients[c as usize].as_mut().expect("client");
        let busy = cl.up.is_some() || cl.out.is_some();
        if !busy && cl.acc.is_empty() && frame(self.bufs.get(bid, n)) == Frame::Message(n) {
            self.dispatch(
                c,
                Out {
                    data: Data::Buf(bid),
                    off: 0,
                    len: n,
                },
            );
        } else {
            cl.acc.extend_from_slice(self.bufs.get(bid, n));
            self.bufs.push(bid);
            self.dispatch_acc(c);
        }
        if !more && self.clients[c as usize].is_some() {
            self.arm_client(c);
        }
    }

    /// A whole request accumulated and the connection free: send it on.
    fn dispatch_acc(&mut self, c: u32) {
        let Some(cl) = self.clients[c as usize].as_mut() else {
            return;
        };
        if cl.up.is_some() || cl.out.is_some() {
            return;
        }
        match frame(&cl.acc) {
            Frame::Message(n) if n <= cl.acc.len() => {
                let rest = cl.acc.split_off(n);
                let msg = std::mem::replace(&mut cl.acc, rest);
                self.dispatch(
                    c,
                    Out {
                        data: Data::Vec(msg),
                        off: 0,
                        len: n,
                    },
                );
            }
            Frame::Bad => self.close_client(c),
            _ => {}
        }
    }

    fn dispatch(&mut self, c: u32, out: Out) {
        let Some(u) = self.idle.pop() else {
            eprintln!("upstream pool exhausted");
            self.release(Some(out));
            self.close_client(c);
            return;
        };
        if let Some(cl) = self.clients[c as usize].as_mut() {
            cl.up = Some(u);
        }
        let up = &mut self.ups[u as usize];
        up.client = Some(c);
        let slot = up.slot;
        self.send(slot, &out, USEND, u);
        self.ups[u as usize].out = Some(out);
        self.arm_up(u, true);
    }

    fn up_sent(&mut self, u: u32, res: i32) {
        let up = &mut self.ups[u as usize];
        let Some(out) = up.out.as_mut() else { return };
        if res > 0 && out.off + (res as usize) < out.len {
            out.off += res as usize;
            let slot = up.slot;
            let out = up.out.take().expect("out");
            self.send(slot, &out, USEND, u);
            self.ups[u as usize].out = Some(out);
            return;
        }
        // done, or failed (the armed receive then sees the error or EOF)
        let out = up.out.take();
        let back = std::mem::take(&mut up.done);
        self.release(out);
        if back {
            self.idle.push(u);
        }
    }

    fn up_recv(&mut self, u: u32, res: i32, flags: u32) {
        let bid = cqueue::buffer_select(flags);
        if res == -libc::ENOBUFS {
            self.arm_up(u, false);
            return;
        }
        if res <= 0 {
            eprintln!("upstream {u} closed: {res}");
            let up = &mut self.ups[u as usize];
            let slot = up.slot;
            let c = up.client.take();
            self.sqes.push(
                opcode::Close::new(types::Fixed(slot))
                    .build()
                    .user_data(ud(CLOSE, slot)),
            );
            if let Some(c) = c {
                if let Some(cl) = self.clients[c as usize].as_mut() {
                    cl.up = None;
                }
                self.close_client(c);
            }
            return;
        }
        let (n, bid) = (res as usize, bid.expect("buffer id"));
        let up = &mut self.ups[u as usize];
        let out = if up.acc.is_empty() && frame(self.bufs.get(bid, n)) == Frame::Message(n) {
            Out {
                data: Data::Buf(bid),
                off: 0,
                len: n,
            }
        } else {
            up.acc.extend_from_slice(self.bufs.get(bid, n));
            self.bufs.push(bid);
            let up = &mut self.ups[u as usize];
            match frame(&up.acc) {
                Frame::Message(m) if m <= up.acc.len() => {
                    let v = std::mem::take(&mut up.acc);
                    Out {
                        data: Data::Vec(v),
                        off: 0,
                        len: m,
                    }
                }
                Frame::Bad => {
                    // the prototype's upstreams always send a length
                    eprintln!("upstream answer not framed by Content-Length");
                    std::process::exit(1);
                }
                _ => {
                    self.arm_up(u, false);
                    return;
                }
            }
        };
        let up = &mut self.ups[u as usize];
        let c = up.client.take();
        if up.out.is_some() {
            up.done = true;
        } else {
            self.idle.push(u);
        }
        let Some(c) = c else {
            self.release(Some(out));
            return;
        };
        let Some(cl) = self.clients[c as usize].as_mut() else {
            self.release(Some(out));
            return;
        };
        cl.up = None;
        if cl.eof {
            self.release(Some(out));
            self.close_client(c);
            return;
        }
        self.send(c, &out, CSEND, c);
        if let Some(cl) = self.clients[c as usize].as_mut() {
            cl.out = Some(out);
        }
    }

    fn client_sent(&mut self, c: u32, res: i32) {
        let Some(cl) = self.clients[c as usize].as_mut() else {
            let out = self.orphans[c as usize].take();
            self.release(out);
            return;
        };
        let Some(out) = cl.out.as_mut() else { return };
        if res > 0 && out.off + (res as usize) < out.len {
            out.off += res as usize;
            let out = cl.out.take().expect("out");
            self.send(c, &out, CSEND, c);
            if let Some(cl) = self.clients[c as usize].as_mut() {
                cl.out = Some(out);
            }
            return;
        }
        let out = cl.out.take();
        let eof = cl.eof;
        self.release(out);
        if res < 0 || eof {
            self.close_client(c);
        } else {
            self.dispatch_acc(c);
        }
    }
}

fn main() -> std::io::Result<()> {
    let a = args();
    let mut b = IoUring::<squeue::Entry, cqueue::Entry>::builder();
    b.setup_coop_taskrun()
        .setup_single_issuer()
        .setup_cqsize(32768);
    if a.defer {
        b.setup_defer_taskrun();
    }
    let mut ring = b.build(4096)?;
    let sub = ring.submitter();
    sub.register_files_sparse(FILES)?;
    let bufs = Bufs::new(&sub)?;

    // upstream pool: slots 0..pool, registered before any accept allocates a slot
    let up: SocketAddr = a.upstream.parse().expect("upstream addr");
    let mut fds = Vec::with_capacity(a.pool);
    for _ in 0..a.pool {
        let s = TcpStream::connect(up)?;
        s.set_nodelay(true)?;
        fds.push(s.into_raw_fd());
    }
    sub.register_files_update(0, &fds)?;
    for fd in &fds {
        // SAFETY: our own fds; the table holds its own reference
        unsafe { libc::close(*fd) };
    }
    let ups: Vec<Up> = (0..a.pool as u32)
        .map(|slot| Up {
            slot,
            client: None,
            acc: Vec::new(),
            out: None,
            done: false,
        })
        .collect();

    let l = TcpListener::bind(&a.listen)?;
    let lfd = l.as_raw_fd();
    let one: libc::c_int = 1;
    // SAFETY: valid fd and option; accepted sockets inherit TCP_NODELAY; a bigger backlog
    unsafe {
        libc::setsockopt(
            lfd,
            libc::IPPROTO_TCP,
            libc::TCP_NODELAY,
            &one as *const _ as *const libc::c_void,
            4,
        );
        libc::listen(lfd, 65535);
    }
    eprintln!(
        "uring: listening on {} (pool {}, defer {})",
        a.listen, a.pool, a.defer
    );

    let mut relay = Relay {
        bufs,
        clients: (0..FILES).map(|_| None).collect(),
        idle: (0..a.pool as u32).rev().collect(),
        ups,
        sqes: Vec::with_capacity(1024),
        lfd,
        orphans: (0..FILES).map(|_| None).collect(),
    };
    relay.arm_accept();
    let (submitter, mut sq, mut cq) = ring.split();
    loop {
        for e in relay.sqes.drain(..) {
            // SAFETY: every pointer in an SQE (buffers, Vec data) stays valid until its CQE
            while unsafe { sq.push(&e) }.is_err() {
                sq.sync();
                submitter.submit()?;
                sq.sync();
            }
        }
        sq.sync();
        match submitter.submit_and_wait(1) {
            Ok(_) => {}
            Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR) | Some(libc::EBUSY)) => {}
            Err(e) => return Err(e),
        }
        cq.sync();
        for cqe in &mut cq {
            relay.on(cqe.user_data(), cqe.result(), cqe.flags());
        }
        // hand the consumed entries back before waiting again (else the wait sees them)
        cq.sync();
    }
}
