//! The runtime under every server in the process (the gateway's shards, the admin listener,
//! the mock): one pinned thread per core, each running its own monoio runtime on its own
//! SO_REUSEPORT listener, the accept loop (`accept_loop`, also the TLS listener's) with its
//! drain (`accept_until`), the shutdown
//! signals (`shutdown`) and the optional idle spin (`spin`). Picks the I/O driver (io_uring with COOP_TASKRUN|SINGLE_ISSUER →
//! plain io_uring → epoll) and says which one each shard got.
//!
//! Owns: listener creation (and refusing a port already in use), driver selection, pinning,
//! thread lifecycle. Must not: know what is served — the caller passes a per-shard `main`.

pub mod shutdown;
pub mod spin;

use std::future::Future;
use std::io;
use std::net::{SocketAddr, TcpListener as StdListener};
use std::thread::JoinHandle;

use monoio::time::TimeDriver;
use monoio::{IoUringDriver, LegacyDriver, RuntimeBuilder};
use socket2::{Domain, Protocol, Socket, Type};

/// Which I/O driver to try.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DriverChoice {
    Auto,
    IoUring,
    Epoll,
}

impl DriverChoice {
    /// From config, overridden by `RINGGATE_DRIVER` (`epoll`, `io_uring`, `auto`).
    pub fn resolve(configured: &str) -> DriverChoice {
        let env = std::env::var("RINGGATE_DRIVER").ok();
        match env.as_deref().unwrap_or(configured) {
            "epoll" | "legacy" => DriverChoice::Epoll,
            "io_uring" | "iouring" => DriverChoice::IoUring,
            _ => DriverChoice::Auto,
        }
    }
}

/// Entries in each shard's ring.
const RING_ENTRIES: u32 = 1024;
/// Stack of each shard thread (virtual until touched). Recursive JSON parsing is bounded by
/// `nesting::MAX_DEPTH` (128); this leaves that bound, not the stack, as what stops deep input.
/// Measured for `extract::routing_fields` at depth 128: under 32 KiB in release builds (the old
/// 2 MiB default overflowed near depth 12,000), but ~6.7 MiB in debug builds (sonic-rs frames
/// are ~53 KiB per level unoptimised), hence 32 MiB there.
pub const STACK_BYTES: usize = if cfg!(debug_assertions) {
    32 << 20
} else {
    8 << 20
};
const BACKLOG: i32 = 4096;

/// Bind `n` SO_REUSEPORT listeners on `addr`. Refuses an address some other socket already
/// listens on (a stale process would otherwise silently take a share of the connections).
pub fn bind_listeners(addr: SocketAddr, n: usize) -> io::Result<(Vec<StdListener>, SocketAddr)> {
    if addr.port() != 0 {
        let probe = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
        probe.set_reuse_address(true)?;
        probe.bind(&addr.into()).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("{addr} is already in use (is another ringgate running?): {e}"),
            )
        })?;
        drop(probe);
    }
    let mut out = Vec::with_capacity(n);
    let mut bound = addr;
    for _ in 0..n.max(1) {
        let s = Socket::new(
            Domain::for_address(bound),
            Type::STREAM,
            Some(Protocol::TCP),
        )?;
        s.set_reuse_address(true)?;
        s.set_reuse_port(true)?;
        s.set_nodelay(true)?;
        s.set_nonblocking(true)?;
        s.bind(&bound.into())?;
        s.listen(BACKLOG)?;
        let l: StdListener = s.into();
        bound = l.local_addr()?;
        out.push(l);
    }
    Ok((out, bound))
}

/// Start one thread per listener. `main(shard_id, listener, driver_name)` is that shard's
/// whole life; it runs on a monoio runtime pinned to a core.
pub fn spawn<F, Fut>(
    listeners: Vec<StdListener>,
    driver: DriverChoice,
    pin: bool,
    main: F,
) -> io::Result<Vec<JoinHandle<()>>>
where
    F: Fn(usize, StdListener, &'static str) -> Fut + Send + Clone + 'static,
    Fut: Future<Output = ()>,
{
    let cores = if pin {
        core_affinity::get_core_ids().unwrap_or_default()
    } else {
        Vec::new()
    };
    let mut handles = Vec::with_capacity(listeners.len());
    for (id, listener) in listeners.into_iter().enumerate() {
        let main = main.clone();
        let core = (!cores.is_empty()).then(|| cores[id % cores.len()]);
        let h = std::thread::Builder::new()
            .name(format!("ringgate-shard-{id}"))
            .stack_size(STACK_BYTES)
            .spawn(move || {
                if let Some(core) = core {
                    core_affinity::set_for_current(core);
                }
                run_on_best_driver(driver, id, move |name| main(id, listener, name));
            })?;
        handles.push(h);
    }
    Ok(handles)
}

/// The io_uring runtimes tried in order: (with the task-run flags COOP_TASKRUN|SINGLE_ISSUER,
/// the driver's name, what failed when it cannot be built, what is tried next).
const URING: [(bool, &str, &str, &str); 2] = [
    (
        true,
        "io_uring (coop_taskrun, single_issuer)",
        "io_uring with task-run flags",
        "trying a plain ring",
    ),
    (false, "io_uring", "io_uring", "falling back to epoll"),
];

/// An io_uring runtime of [`RING_ENTRIES`] entries, with the task-run flags or plain.
fn uring(flagged: bool) -> io::Result<monoio::Runtime<TimeDriver<IoUringDriver>>> {
    let mut builder = RuntimeBuilder::<IoUringDriver>::new().with_entries(RING_ENTRIES);
    if flagged {
        let mut flags = io_uring::IoUring::builder();
        flags.setup_coop_taskrun().setup_single_issuer();
        builder = builder.uring_builder(flags);
    }
    builder.enable_timer().build()
}

/// Build the best runtime `choice` allows and run `make(driver_name)` to completion on it.
pub fn run_on_best_driver<F, Fut>(choice: DriverChoice, id: usize, make: F)
where
    F: FnOnce(&'static str) -> Fut,
    Fut: Future<Output = ()>,
{
    if choice != DriverChoice::Epoll {
        for (flagged, name, what, next) in URING {
            match uring(flagged) {
                Ok(mut rt) => {
                    crate::observe::log::info(format_args!("shard {id}: driver {name}"));
                    rt.block_on(make(name));
                    return;
                }
                Err(e) => crate::observe::log::info(format_args!(
                    "shard {id}: {what} unavailable ({e}); {next}"
                )),
            }
        }
    }
    match RuntimeBuilder::<LegacyDriver>::new().enable_timer().build() {
        Ok(mut rt) => {
            let name = "epoll";
            crate::observe::log::info(format_args!("shard {id}: driver {name}"));
            rt.block_on(make(name));
        }
        Err(e) => crate::observe::log::info(format_args!("shard {id}: no usable I/O driver: {e}")),
    }
}

/// The driver [`run_on_best_driver`] would give a shard here, and why each better one was not
/// available (for `ringgate doctor`): builds each runtime the same way, then drops it.
pub fn probe_driver(choice: DriverChoice) -> (&'static str, Vec<String>) {
    let mut why = Vec::new();
    if choice != DriverChoice::Epoll {
        for (flagged, name, what, _) in URING {
            match uring(flagged) {
                Ok(_) => return (name, why),
                Err(e) => why.push(format!("{what}: {e}")),
            }
        }
    }
    match RuntimeBuilder::<LegacyDriver>::new().enable_timer().build() {
        Ok(_) => ("epoll", why),
        Err(e) => {
            why.push(format!("epoll: {e}"));
            ("none", why)
        }
    }
}

/// How a shard stops: `started` fires when the listener closes (idle keep-alive connections
/// end); in-flight requests get `time` to finish; then `expired` fires (streams still running
/// end properly — error event, chunked end) and they get a short grace to write that end.
pub struct Drain<'a> {
    pub started: &'a crate::runtime::shutdown::LocalSignal,
    pub expired: Option<&'a crate::runtime::shutdown::LocalSignal>,
    pub time: std::time::Duration,
}

/// Longest wait, after the drain time is up, for cut streams to write their last bytes.
const CUT_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

/// Adopt `std_listener` and hand every accepted connection (and its peer's address) to
/// `on_conn` until `shutdown` fires, then close the listener. `false`: it could not be adopted
/// (said in the log; nothing was accepted).
pub async fn accept_loop<F>(
    name: &str,
    std_listener: StdListener,
    shutdown: &crate::runtime::shutdown::Shutdown,
    mut on_conn: F,
) -> bool
where
    F: FnMut(monoio::net::TcpStream, std::net::SocketAddr),
{
    let listener = match monoio::net::TcpListener::from_std(std_listener) {
        Ok(l) => l,
        Err(e) => {
            crate::observe::log::info(format_args!("{name}: cannot adopt listener: {e}"));
            return false;
        }
    };
    let mut stop = std::pin::pin!(shutdown.wait());
    loop {
        monoio::select! {
            _ = &mut stop => break,
            r = listener.accept() => match r {
                Ok((stream, peer)) => on_conn(stream, peer),
                Err(e) => {
                    // EMFILE and friends: back off briefly instead of spinning.
                    crate::observe::log::info(format_args!("{name}: accept: {e}"));
                    monoio::time::sleep(std::time::Duration::from_millis(10)).await;
                }
            }
        }
    }
    true
}

/// A shard's accept loop ([`accept_loop`]): adopt `std_listener`, hand every accepted connection (and its
/// peer's address) to `on_conn` until `shutdown` fires; then close the listener (new connections are refused) and drain
/// (see [`Drain`]) while `open()` is above zero.
pub async fn accept_until<F, O>(
    name: &str,
    std_listener: StdListener,
    shutdown: &crate::runtime::shutdown::Shutdown,
    drain: Drain<'_>,
    open: O,
    on_conn: F,
) where
    F: FnMut(monoio::net::TcpStream, std::net::SocketAddr),
    O: Fn() -> u64,
{
    if !accept_loop(name, std_listener, shutdown, on_conn).await {
        return;
    }
    drain.started.fire();
    let open = &open;
    let wait_open = |until: std::time::Instant| async move {
        while open() > 0 && std::time::Instant::now() < until {
            monoio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    };
    wait_open(std::time::Instant::now() + drain.time).await;
    if let Some(expired) = drain.expired {
        if open() > 0 {
            crate::observe::log::info(format_args!(
                "{name}: drain time ({} ms) is up; ending {} open connection(s)",
                drain.time.as_millis(),
                open()
            ));
            expired.fire();
            wait_open(std::time::Instant::now() + CUT_GRACE).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_port_in_use() {
        let (_ls, addr) = bind_listeners("127.0.0.1:0".parse().unwrap(), 2).unwrap();
        let err = bind_listeners(addr, 1).unwrap_err();
        assert!(err.to_string().contains("already in use"), "{err}");
    }
}
