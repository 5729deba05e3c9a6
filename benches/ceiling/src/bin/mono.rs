//! The monoio skeleton of the relay (issue 23's ceiling prototype): the same logic as
//! `uring.rs` on monoio 0.2.4's io_uring driver as the gateway builds it (COOP_TASKRUN |
//! SINGLE_ISSUER, 1,024 entries; `--defer` adds DEFER_TASKRUN): a task per client connection, owned 4 KiB buffers, one
//! `write_all` per message, upstream connections pooled (made on demand, kept idle with their
//! buffer). Parsing: `ringgate_ceiling::frame` (end of head + Content-Length), bytes forwarded
//! as they came.

use monoio::buf::{IoBuf, IoBufMut};
use monoio::io::{AsyncReadRent, AsyncWriteRentExt};
use monoio::net::{ListenerOpts, TcpListener, TcpStream};
use monoio::{IoUringDriver, RuntimeBuilder};
use ringgate_ceiling::{args, frame, Frame};
use std::cell::RefCell;
use std::net::SocketAddr;
use std::rc::Rc;

const BUF: usize = 4096;

type Pool = Rc<RefCell<Vec<(TcpStream, Vec<u8>)>>>;

fn main() {
    let a = args();
    let mut flagged = io_uring::IoUring::builder();
    flagged.setup_coop_taskrun().setup_single_issuer();
    if a.defer {
        // not what the gateway builds today: the flag alone, to tell it from the operations
        flagged.setup_defer_taskrun();
    }
    let mut rt = RuntimeBuilder::<IoUringDriver>::new()
        .with_entries(1024)
        .uring_builder(flagged)
        .build()
        .expect("io_uring runtime");
    rt.block_on(serve(
        a.listen,
        a.upstream.parse().expect("upstream addr"),
        a.pool,
    ));
}

async fn serve(listen: String, up: SocketAddr, keep: usize) {
    let addr: SocketAddr = listen.parse().expect("listen addr");
    let opts = ListenerOpts::new().backlog(65535).reuse_addr(true);
    let l = TcpListener::bind_with_config(addr, &opts).expect("bind");
    eprintln!("mono: listening on {addr}");
    let pool: Pool = Rc::new(RefCell::new(Vec::new()));
    loop {
        if let Ok((s, _)) = l.accept().await {
            let _ = s.set_nodelay(true);
            monoio::spawn(client(s, up, pool.clone(), keep));
        }
    }
}

/// Read until `buf` (which may hold leftover bytes) starts with one whole message; its length.
async fn read_message(s: &mut TcpStream, mut buf: Vec<u8>) -> (Option<usize>, Vec<u8>) {
    loop {
        match frame(&buf) {
            Frame::Message(n) if n <= buf.len() => return (Some(n), buf),
            Frame::Bad => return (None, buf),
            Frame::Message(n) => buf.reserve(n - buf.len()),
            Frame::Partial if buf.len() == buf.capacity() => buf.reserve(BUF),
            Frame::Partial => {}
        }
        let len = buf.len();
        let (r, slice) = s.read(buf.slice_mut(len..)).await;
        buf = slice.into_inner();
        match r {
            Ok(0) | Err(_) => return (None, buf),
            Ok(_) => {}
        }
    }
}

async fn client(mut s: TcpStream, up: SocketAddr, pool: Pool, keep: usize) {
    let mut cbuf = Vec::with_capacity(BUF);
    loop {
        let (n, b) = read_message(&mut s, cbuf).await;
        cbuf = b;
        let Some(n) = n else { return };
        let pooled = pool.borrow_mut().pop();
        let (mut us, ubuf) = match pooled {
            Some(p) => p,
            None => match TcpStream::connect(up).await {
                Ok(us) => {
                    let _ = us.set_nodelay(true);
                    (us, Vec::with_capacity(BUF))
                }
                Err(_) => return,
            },
        };
        let (r, sl) = us.write_all(cbuf.slice(..n)).await;
        cbuf = sl.into_inner();
        if r.is_err() {
            return;
        }
        cbuf.drain(..n);
        let (m, ub) = read_message(&mut us, ubuf).await;
        let Some(m) = m else { return };
        let (r, sl) = s.write_all(ub.slice(..m)).await;
        let mut ub = sl.into_inner();
        ub.drain(..m);
        if ub.is_empty() && pool.borrow().len() < keep {
            pool.borrow_mut().push((us, ub));
        }
        if r.is_err() {
            return;
        }
    }
}
