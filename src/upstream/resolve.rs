//! DNS off the shard: upstream host names are resolved by helper threads (the system resolver,
//! `getaddrinfo`, which blocks), cached by TTL and refreshed in the background before they
//! expire; a shard that misses its own cache awaits the answer asynchronously, with a deadline.
//!
//! Owns: the process-wide name cache and its helper threads ([`Resolver`], [`global`]), and each
//! shard's copy of what it used ([`LocalDns`]).
//! Must not: block a shard (a shard only takes the cache's lock for a map probe, once per name
//! per TTL, never across a lookup), open sockets, or know about HTTP.
//!
//! Policy:
//! - The system resolver reports no TTL, so an answer is fresh for [`TTL`] (60 s). The helpers
//!   look every known name up again at 3/4 of that, so a shard whose copy expires finds a fresh
//!   answer without waiting.
//! - A failed lookup is remembered for [`RETRY`] (5 s; requests in that window fail at once
//!   with the same reason) and retried then. A failed *refresh* keeps serving the last good
//!   addresses (retrying every 5 s) for up to [`STALE_LIMIT`] (10 min) after they expired.
//! - Names are learned at start (the gateway primes every configured upstream host) and on a
//!   shard's first miss; known names are refreshed for the life of the process (a config names
//!   a handful).
//! - A shard waits for a first answer at most its deadline (the connect timeout), then the
//!   request fails with a clear upstream error; the lookup goes on and fills the cache.

use std::cell::RefCell;
use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::pin::Pin;
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

/// How long an answer is used (the system resolver gives no TTL).
pub const TTL: Duration = Duration::from_secs(60);
/// How long a failure is remembered before the name is tried again.
pub const RETRY: Duration = Duration::from_secs(5);
/// Longest the last good addresses are served while refreshes fail.
pub const STALE_LIMIT: Duration = Duration::from_secs(600);
/// Helper threads: two, so one slow name does not hold up the others.
const HELPERS: usize = 2;

/// How names are looked up (the system resolver; tests substitute their own).
pub type LookupFn = fn(&str, u16) -> io::Result<Vec<SocketAddr>>;

/// `getaddrinfo` through the standard library.
pub fn system_lookup(host: &str, port: u16) -> io::Result<Vec<SocketAddr>> {
    let addrs: Vec<SocketAddr> = (host, port).to_socket_addrs()?.collect();
    if addrs.is_empty() {
        return Err(io::Error::new(io::ErrorKind::NotFound, "no address"));
    }
    Ok(addrs)
}

/// Why a name has no address for a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResolveError {
    /// The resolver answered with an error (message from the system resolver).
    Failed(String),
    /// No answer within the caller's deadline.
    TimedOut(Duration),
}

impl std::fmt::Display for ResolveError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ResolveError::Failed(e) => write!(f, "{e}"),
            ResolveError::TimedOut(d) => {
                write!(f, "no answer from the resolver within {} ms", d.as_millis())
            }
        }
    }
}

type Key = (String, u16);
type Answer = Result<Arc<[SocketAddr]>, String>;

/// The process-wide cache and its helper threads. Cloning is an `Arc` clone.
#[derive(Clone)]
pub struct Resolver {
    shared: Arc<Shared>,
}

struct Shared {
    state: Mutex<State>,
    work: Condvar,
    lookup: LookupFn,
}

#[derive(Default)]
struct State {
    entries: HashMap<Key, Entry>,
    helpers: usize,
}

struct Entry {
    /// The last answer: `None` until the first lookup ends.
    answer: Option<Answer>,
    /// Until when `answer` may be used.
    fresh_until: Instant,
    /// When a helper looks the name up again.
    refresh_at: Instant,
    /// When the last successful lookup ended.
    good_at: Option<Instant>,
    in_flight: bool,
    waiters: Vec<Arc<Slot>>,
}

/// One shard's wait for a first answer, completed from a helper thread.
#[derive(Default)]
struct Slot {
    inner: Mutex<SlotInner>,
}

#[derive(Default)]
struct SlotInner {
    answer: Option<Answer>,
    waker: Option<Waker>,
}

impl Slot {
    fn complete(&self, answer: Answer) {
        let waker = match self.inner.lock() {
            Ok(mut s) => {
                s.answer = Some(answer);
                s.waker.take()
            }
            Err(_) => None,
        };
        if let Some(w) = waker {
            w.wake();
        }
    }
}

struct SlotWait(Arc<Slot>);

impl Future for SlotWait {
    type Output = Answer;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Answer> {
        let Ok(mut s) = self.0.inner.lock() else {
            return Poll::Ready(Err("resolver state poisoned".into()));
        };
        match s.answer.take() {
            Some(a) => Poll::Ready(a),
            None => {
                match &mut s.waker {
                    Some(w) => w.clone_from(cx.waker()),
                    None => s.waker = Some(cx.waker().clone()),
                }
                Poll::Pending
            }
        }
    }
}

/// What a shard gets from the shared cache.
enum Probe {
    Ready(Answer, Instant),
    Wait(Arc<Slot>),
}

/// The process-wide resolver (system lookups); its helper threads start on first use.
pub fn global() -> &'static Resolver {
    static GLOBAL: OnceLock<Resolver> = OnceLock::new();
    GLOBAL.get_or_init(|| Resolver::new(system_lookup))
}

impl Resolver {
    /// A resolver using `lookup`; helper threads start with the first name.
    pub fn new(lookup: LookupFn) -> Resolver {
        Resolver {
            shared: Arc::new(Shared {
                state: Mutex::new(State::default()),
                work: Condvar::new(),
                lookup,
            }),
        }
    }

    /// Learn `names` and look them up now in the background (start-up: every configured
    /// upstream host). IP literals are skipped.
    pub fn prime<'a>(&self, names: impl IntoIterator<Item = (&'a str, u16)>) {
        let Ok(mut st) = self.shared.state.lock() else {
            return;
        };
        let mut any = false;
        for (host, port) in names {
            if host.parse::<IpAddr>().is_ok() {
                continue;
            }
            st.entries
                .entry((host.to_string(), port))
                .or_insert_with(Entry::new);
            any = true;
        }
        if any {
            self.ensure_helpers(&mut st);
            self.shared.work.notify_all();
        }
    }

    /// The cached answer for `host:port`, or a slot a helper completes (the name is learned).
    fn probe(&self, host: &str, port: u16) -> Probe {
        let Ok(mut st) = self.shared.state.lock() else {
            return Probe::Ready(Err("resolver state poisoned".into()), Instant::now());
        };
        let now = Instant::now();
        let key = (host.to_string(), port);
        if let Some(e) = st.entries.get_mut(&key) {
            if let Some(a) = &e.answer {
                if now < e.fresh_until {
                    return Probe::Ready(a.clone(), e.fresh_until);
                }
            }
            let slot = Arc::new(Slot::default());
            e.waiters.push(slot.clone());
            if !e.in_flight {
                e.refresh_at = now;
                self.shared.work.notify_one();
            }
            return Probe::Wait(slot);
        }
        let mut e = Entry::new();
        let slot = Arc::new(Slot::default());
        e.waiters.push(slot.clone());
        st.entries.insert(key, e);
        self.ensure_helpers(&mut st);
        self.shared.work.notify_one();
        Probe::Wait(slot)
    }

    fn ensure_helpers(&self, st: &mut State) {
        while st.helpers < HELPERS {
            let shared = self.shared.clone();
            let spawned = std::thread::Builder::new()
                .name("ringgate-dns".into())
                .spawn(move || helper(&shared));
            if spawned.is_err() {
                break;
            }
            st.helpers += 1;
        }
    }
}

impl Entry {
    fn new() -> Entry {
        let now = Instant::now();
        Entry {
            answer: None,
            fresh_until: now,
            refresh_at: now,
            good_at: None,
            in_flight: false,
            waiters: Vec::new(),
        }
    }
}

/// A helper thread: take the name whose refresh is due soonest, look it up (blocking, outside
/// the lock), store the answer, complete the waiters; sleep until the next refresh is due.
fn helper(shared: &Shared) {
    let Ok(mut st) = shared.state.lock() else {
        return;
    };
    loop {
        let now = Instant::now();
        let due = st
            .entries
            .iter()
            .filter(|(_, e)| !e.in_flight)
            .min_by_key(|(_, e)| e.refresh_at)
            .map(|(k, e)| (k.clone(), e.refresh_at));
        let key = match due {
            Some((k, at)) if at <= now => k,
            Some((_, at)) => {
                st = match shared.work.wait_timeout(st, at - now) {
                    Ok((g, _)) => g,
                    Err(_) => return,
                };
                continue;
            }
            None => {
                st = match shared.work.wait(st) {
                    Ok(g) => g,
                    Err(_) => return,
                };
                continue;
            }
        };
        if let Some(e) = st.entries.get_mut(&key) {
            e.in_flight = true;
        }
        drop(st);
        let result = (shared.lookup)(&key.0, key.1);
        st = match shared.state.lock() {
            Ok(g) => g,
            Err(_) => return,
        };
        let Some(e) = st.entries.get_mut(&key) else {
            continue;
        };
        e.in_flight = false;
        let now = Instant::now();
        match result {
            Ok(addrs) => {
                e.answer = Some(Ok(addrs.into()));
                e.fresh_until = now + TTL;
                e.refresh_at = now + TTL * 3 / 4;
                e.good_at = Some(now);
            }
            Err(err) => {
                let stale_ok = matches!(e.answer, Some(Ok(_)))
                    && e.good_at
                        .is_some_and(|t| now.duration_since(t) < TTL + STALE_LIMIT);
                if !stale_ok {
                    e.answer = Some(Err(err.to_string()));
                }
                e.fresh_until = now + RETRY;
                e.refresh_at = now + RETRY;
            }
        }
        let answer = e.answer.clone();
        for w in std::mem::take(&mut e.waiters) {
            if let Some(a) = &answer {
                w.complete(a.clone());
            }
        }
    }
}

/// One shard's copy of the answers it used: hits cost a map probe, no lock. Lives in the
/// shard's upstream pool.
pub struct LocalDns {
    resolver: Resolver,
    cache: RefCell<HashMap<Key, (SocketAddr, Instant)>>,
}

impl LocalDns {
    pub fn new(resolver: Resolver) -> LocalDns {
        LocalDns {
            resolver,
            cache: RefCell::new(HashMap::new()),
        }
    }

    /// The address to connect to for `host:port`. IP literals cost nothing; a fresh local copy
    /// a map probe; otherwise the shared cache answers, or a helper does within `deadline`.
    pub async fn resolve(
        &self,
        host: &str,
        port: u16,
        deadline: Duration,
    ) -> Result<SocketAddr, ResolveError> {
        if let Ok(ip) = host.parse::<IpAddr>() {
            return Ok(SocketAddr::new(ip, port));
        }
        let key = (host.to_string(), port);
        if let Some(&(addr, until)) = self.cache.borrow().get(&key) {
            if Instant::now() < until {
                return Ok(addr);
            }
        }
        let (answer, until) = match self.resolver.probe(host, port) {
            Probe::Ready(a, until) => (a, Some(until)),
            Probe::Wait(slot) => match monoio::time::timeout(deadline, SlotWait(slot)).await {
                Ok(a) => (a, None),
                Err(_) => return Err(ResolveError::TimedOut(deadline)),
            },
        };
        let addrs = answer.map_err(ResolveError::Failed)?;
        let addr = *addrs
            .first()
            .ok_or_else(|| ResolveError::Failed("no address".into()))?;
        let until = until.unwrap_or_else(|| Instant::now() + TTL);
        self.cache.borrow_mut().insert(key, (addr, until));
        Ok(addr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn run<F: Future>(f: F) -> F::Output {
        monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
            .enable_timer()
            .build()
            .unwrap()
            .block_on(f)
    }

    #[test]
    fn localhost_resolves_and_invalid_fails_with_the_reason() {
        let dns = LocalDns::new(Resolver::new(system_lookup));
        run(async {
            let a = dns
                .resolve("localhost", 8080, Duration::from_secs(5))
                .await
                .unwrap();
            assert!(a.ip().is_loopback() && a.port() == 8080, "{a}");
            let e = dns
                .resolve("nothing.invalid", 80, Duration::from_secs(5))
                .await
                .unwrap_err();
            assert!(matches!(e, ResolveError::Failed(_)), "{e:?}");
            // remembered: the second request gets the same reason from the cache
            let e2 = dns
                .resolve("nothing.invalid", 80, Duration::from_secs(5))
                .await
                .unwrap_err();
            assert_eq!(e, e2);
            assert_eq!(
                dns.resolve("10.1.2.3", 5, Duration::ZERO).await,
                Ok("10.1.2.3:5".parse().unwrap())
            );
        });
    }

    /// Lookups of `slow`, and how many of them the test has let finish.
    static SLOW_CALLS: AtomicUsize = AtomicUsize::new(0);
    static SLOW_RELEASED: AtomicUsize = AtomicUsize::new(0);
    fn slow(_: &str, port: u16) -> io::Result<Vec<SocketAddr>> {
        let n = SLOW_CALLS.fetch_add(1, Ordering::SeqCst) + 1;
        let t = Instant::now();
        while SLOW_RELEASED.load(Ordering::SeqCst) < n && t.elapsed() < Duration::from_secs(20) {
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(vec![SocketAddr::from(([127, 0, 0, 9], port))])
    }

    #[test]
    fn a_slow_resolver_times_the_request_out_without_blocking_the_shard() {
        let dns = LocalDns::new(Resolver::new(slow));
        run(slow_case(&dns, 1));
        // The answer from another thread wakes an io_uring shard too.
        let dns = LocalDns::new(Resolver::new(slow));
        if let Ok(mut rt) = monoio::RuntimeBuilder::<monoio::IoUringDriver>::new()
            .enable_timer()
            .build()
        {
            rt.block_on(slow_case(&dns, 2));
        }
    }

    /// The `n`th lookup of `slow` is held until the request timed out and another task ran.
    async fn slow_case(dns: &LocalDns, n: usize) {
        let ticked = std::rc::Rc::new(std::cell::Cell::new(false));
        let t2 = ticked.clone();
        let ticker = monoio::spawn(async move {
            monoio::time::sleep(Duration::from_millis(5)).await;
            t2.set(true);
        });
        let e = dns
            .resolve("slow.test", 1, Duration::from_millis(50))
            .await
            .unwrap_err();
        assert_eq!(e, ResolveError::TimedOut(Duration::from_millis(50)));
        ticker.await;
        assert!(ticked.get(), "the shard ran other tasks while waiting");
        // The lookup goes on and fills the cache: a later request gets its answer.
        SLOW_RELEASED.store(n, Ordering::SeqCst);
        let a = dns
            .resolve("slow.test", 1, Duration::from_secs(20))
            .await
            .unwrap();
        assert_eq!(a, "127.0.0.9:1".parse().unwrap());
        assert_eq!(SLOW_CALLS.load(Ordering::SeqCst), n, "one lookup per name");
    }

    static PRIMED_CALLS: AtomicUsize = AtomicUsize::new(0);
    fn counted(_: &str, port: u16) -> io::Result<Vec<SocketAddr>> {
        PRIMED_CALLS.fetch_add(1, Ordering::SeqCst);
        Ok(vec![SocketAddr::from(([127, 0, 0, 7], port))])
    }

    #[test]
    fn primed_names_are_looked_up_before_the_first_request() {
        let r = Resolver::new(counted);
        r.prime([("primed.test", 443), ("127.0.0.1", 80)]);
        let answered = || {
            let st = r.shared.state.lock().unwrap();
            st.entries.values().all(|e| e.answer.is_some())
        };
        let t = Instant::now();
        while !answered() && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(2));
        }
        assert_eq!(
            PRIMED_CALLS.load(Ordering::SeqCst),
            1,
            "IP literals skipped"
        );
        match r.probe("primed.test", 443) {
            Probe::Ready(Ok(a), until) => {
                assert_eq!(a[0], "127.0.0.7:443".parse().unwrap());
                assert!(until > Instant::now() + TTL / 2);
            }
            _ => panic!("not cached"),
        }
    }
}
