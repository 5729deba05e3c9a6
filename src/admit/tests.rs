//! Tests of the `Admission` facade and config, plus property-style tests of the whole module.
//!
//! Owns: cross-file tests (config → admission → permit → pool → queue) and the randomized
//! "everything comes back" invariants, driven by a tiny deterministic PRNG.
//! Must not: be compiled outside `cfg(test)` or depend on timing finer than tens of milliseconds.

use super::*;
use std::cell::RefCell;
use std::rc::Rc;

/// A runtime for one test (io_uring where the kernel has it, else epoll), timers on.
pub(super) fn rt() -> monoio::FusionRuntime<
    monoio::time::TimeDriver<monoio::IoUringDriver>,
    monoio::time::TimeDriver<monoio::LegacyDriver>,
> {
    monoio::RuntimeBuilder::<monoio::FusionDriver>::new()
        .enable_timer()
        .build()
        .unwrap()
}

/// xorshift64*: deterministic, good enough to shuffle operations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

fn cfg(toml_text: &str) -> AdmissionConfig {
    toml::from_str(toml_text).unwrap()
}

#[test]
fn config_defaults() {
    let c = cfg("");
    let d = AdmissionConfig::default();
    assert_eq!(c, d);
    assert_eq!(c.mode, Mode::Drop);
    assert_eq!(c.queue_timeout_ms, 2000);
    assert_eq!(c.max_in_flight, 10_000);
    assert_eq!(c.max_body, 32 << 20);
    assert_eq!(c.max_queue, 1024);
    assert_eq!(c.response_reserve, 64 << 10);
    assert_eq!(c.connection_reserve, 8 << 10);
    assert_eq!(c.memory_budget, default_budget());
    assert!(c.validate().is_ok());
}

#[test]
fn config_sizes_and_modes() {
    let c = cfg(r#"
        memory_budget = "64MiB"
        mode = "block"
        queue_timeout_ms = 50
        max_in_flight = 7
        max_body = 1048576
        max_queue = 3
        response_reserve = "4KiB"
        connection_reserve = "2KiB"
        "#);
    assert_eq!(c.memory_budget, 64 << 20);
    assert_eq!(c.mode, Mode::Block);
    assert_eq!(c.max_body, 1 << 20);
    assert_eq!(c.response_reserve, 4096);
    assert_eq!(c.connection_reserve, 2048);
    assert_eq!(cfg("memory_budget = 1000").memory_budget, 1000);
    assert_eq!(
        cfg("memory_budget = \"auto\"").memory_budget,
        default_budget()
    );
    if let Some(l) = memlimit::memory_limit() {
        assert_eq!(
            cfg("memory_budget = \"10%\"").memory_budget,
            l.bytes / 100 * 10
        );
    }
    for bad in [
        "mode = \"queue\"",
        "max_body = \"huge\"",
        "memory_budget = \"0%\"",
        "unknown = 1",
        "max_in_flight = -1",
    ] {
        assert!(toml::from_str::<AdmissionConfig>(bad).is_err(), "{bad}");
    }
    assert!(cfg("max_in_flight = 0").validate().is_err());
    assert!(cfg("memory_budget = 0").validate().is_err());
    assert!(cfg("mode = \"block\"\nqueue_timeout_ms = 0")
        .validate()
        .is_err());
    let w = cfg("memory_budget = \"32MiB\"\nmax_body = \"32MiB\"").warnings(2);
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(cfg("mode = \"block\"\nmax_queue = 0").warnings(1).len() == 1);
}

#[test]
fn new_splits_across_shards() {
    let c = cfg("memory_budget = \"100MiB\"\nmax_in_flight = 10\nmax_queue = 5");
    let a = Admission::new(&c, 4);
    let s = a.stats();
    assert_eq!(s.capacity, 25 << 20);
    assert_eq!(s.max_in_flight, 3);
    assert_eq!(s.max_queue, 2);
    let a = Admission::new(&c, 0);
    assert_eq!(a.stats().capacity, 100 << 20);
}

#[test]
fn admit_drop_mode() {
    rt().block_on(async {
        let c =
            cfg("memory_budget = 1000\nmax_body = 600\nresponse_reserve = 100\nmax_in_flight = 2");
        let a = Admission::new(&c, 1).with_shard(0);
        assert_eq!(a.admit(601).await.err(), Some(Reject::BodyTooLarge));
        let p = a.admit(500).await.unwrap();
        assert_eq!(p.bytes(), 600);
        assert_eq!(a.admit(400).await.err(), Some(Reject::Budget));
        let q = a.try_admit(0).unwrap();
        assert_eq!(a.try_admit(0).err(), Some(Reject::InFlight));
        let s = a.stats();
        assert_eq!((s.used, s.in_flight, s.peak), (700, 2, 700));
        assert_eq!(s.rejected(Reject::BodyTooLarge), 1);
        assert_eq!(s.rejected(Reject::Budget), 1);
        assert_eq!(s.rejected(Reject::InFlight), 1);
        drop((p, q));
        assert_eq!(a.stats().used, 0);
        let mut out = String::new();
        a.render_prometheus(2, &mut out);
        assert!(out.contains("ringgate_budget_bytes{shard=\"2\"} 1000"));
        assert!(
            out.contains("ringgate_admission_rejections_total{shard=\"2\",reason=\"in_flight\"} 1")
        );
        assert_eq!(a.mode(), Mode::Drop);
        assert_eq!((a.max_body(), a.response_reserve()), (600, 100));
    });
}

#[test]
fn admit_block_mode_waits_then_times_out() {
    rt().block_on(async {
        let c = cfg(
            "memory_budget = 1000\nmode = \"block\"\nqueue_timeout_ms = 40\nresponse_reserve = 0\nmax_queue = 1",
        );
        let a = Rc::new(Admission::new(&c, 1));
        assert_eq!(a.queue_timeout(), Duration::from_millis(40));
        let hold = a.admit(1000).await.unwrap();
        let a2 = a.clone();
        let waiter = monoio::spawn(async move { a2.admit(10).await.map(|p| p.bytes()) });
        monoio::time::sleep(Duration::from_millis(5)).await;
        assert_eq!(a.stats().queued, 1);
        assert_eq!(a.admit(10).await.err(), Some(Reject::QueueFull));
        drop(hold);
        assert_eq!(waiter.await, Ok(10));
        let hold = a.admit(1000).await.unwrap();
        assert_eq!(a.admit(1).await.err(), Some(Reject::QueueTimeout));
        drop(hold);
        let s = a.stats();
        assert_eq!((s.used, s.in_flight, s.queued), (0, 0, 0));
        assert_eq!(s.rejected_by_reason, [0, 0, 1, 1, 0]);
    });
}

/// Open connections hold `connection_reserve` each from the shared budget, without an
/// in-flight slot: what they hold is not available to requests, a connection that does not fit
/// is refused (counted as `budget`), and a closing connection gives its bytes back.
#[test]
fn connections_are_charged_to_the_shared_budget() {
    let c = cfg(
        "memory_budget = 1000\nresponse_reserve = 100\nconnection_reserve = 300\nmax_in_flight = 1\nconnection_share = 100",
    );
    let a = Admission::new(&c, 1);
    let c1 = a.connection().unwrap();
    let c2 = a.connection().unwrap();
    assert_eq!(c1.bytes(), 300);
    let s = a.stats();
    assert_eq!((s.used, s.connection_bytes, s.connections), (600, 600, 2));
    assert_eq!(s.in_flight, 0, "a connection is not a request");
    // 400 left: a request needing 500 does not fit while the connections are open.
    assert_eq!(a.try_admit(400).err(), Some(Reject::Budget));
    let p = a.try_admit(250).unwrap();
    assert_eq!(a.stats().used, 950);
    // The in-flight limit does not apply to connections, the byte budget does.
    assert_eq!(a.connection().err(), Some(Reject::Budget));
    assert_eq!(a.stats().rejected(Reject::Budget), 2);
    drop(c1);
    let s = a.stats();
    assert_eq!((s.used, s.connection_bytes, s.connections), (650, 300, 1));
    let c3 = a.connection().unwrap();
    assert!(format!("{c3:?}").contains("300"));
    drop((p, c2, c3));
    let s = a.stats();
    assert_eq!(
        (s.used, s.connection_bytes, s.connections, s.in_flight),
        (0, 0, 0, 0)
    );
    assert_eq!(s.peak, 950);
    let mut out = String::new();
    a.render_prometheus(0, &mut out);
    assert!(out.contains("ringgate_budget_connection_bytes{shard=\"0\"} 0\n"));
}

/// Connections hold at most `connection_share` of the budget (default half): the rest stays
/// for requests however many connections are open; a connection whose request has a valid
/// key is charged past the share, within the budget.
#[test]
fn connections_keep_to_their_share() {
    let c = cfg("memory_budget = 1000\nresponse_reserve = 100\nconnection_reserve = 200");
    assert_eq!(c.connection_share, 50);
    let a = Admission::new(&c, 1);
    let held: Vec<_> = (0..2).map(|_| a.connection().unwrap()).collect();
    assert_eq!(a.connection().err(), Some(Reject::Budget), "past the share");
    assert_eq!(a.budget().connection_limit(), 500);
    // the other half is for requests
    let p = a.try_admit(300).unwrap();
    drop(p);
    // a keyed connection goes past the share, not past the budget
    let k1 = a.keyed_connection().unwrap();
    let k2 = a.keyed_connection().unwrap();
    let k3 = a.keyed_connection().unwrap();
    assert_eq!(a.stats().used, 1000);
    assert_eq!(a.keyed_connection().err(), Some(Reject::Budget));
    drop((held, k1, k2, k3));
    assert_eq!(a.stats().used, 0);
    assert!(cfg("connection_share = 0").validate().is_err());
    assert!(cfg("connection_share = 101").validate().is_err());
}

/// Block mode: a connection never waits (it takes what is left now, even with requests
/// queued — it is not a request and is much smaller), and bytes a closing connection gives
/// back serve the queued head.
#[test]
fn connection_bytes_returned_serve_queued_requests() {
    rt().block_on(async {
        let c = cfg(
            "memory_budget = 1000\nmode = \"block\"\nqueue_timeout_ms = 2000\nresponse_reserve = 0\nconnection_reserve = 200",
        );
        let a = Rc::new(Admission::new(&c, 1));
        let conn = a.connection().unwrap();
        let hold = a.admit(700).await.unwrap();
        let a2 = a.clone();
        let waiter = monoio::spawn(async move { a2.admit(300).await.map(|p| p.bytes()) });
        monoio::time::sleep(Duration::from_millis(5)).await;
        assert_eq!(a.stats().queued, 1, "300 does not fit in the 100 left");
        // A small connection takes the 100 left at once although a request is queued.
        let small = a.budget().charge_connection(100).unwrap();
        assert_eq!(a.stats().used, 1000);
        drop(small);
        drop(conn);
        assert_eq!(waiter.await, Ok(300), "the connection's bytes served the waiter");
        drop(hold);
        let s = a.stats();
        assert_eq!((s.used, s.in_flight, s.queued, s.connections), (0, 0, 0, 0));
    });
}

#[test]
fn body_as_chunk_chain_counts_against_permit() {
    let c = cfg("memory_budget = \"1MiB\"\nresponse_reserve = \"16KiB\"");
    let a = Admission::new(&c, 1);
    let body = vec![b'x'; 40_000];
    let p = a.try_admit(body.len() as u64).unwrap();
    let mut chain = a.pool().chain(&p);
    for part in body.chunks(1500) {
        chain.push_bytes(part).unwrap();
    }
    assert_eq!(chain.to_vec(), body);
    // 3 chunks of 16 KiB = 49152 bytes, inside the 40000 + 16384 reservation.
    assert_eq!(chain.charged_bytes(), 3 * 16384);
    assert_eq!(p.bytes(), 40_000 + 16_384);
    assert_eq!(a.stats().used, p.bytes());
    drop(chain);
    drop(p);
    assert_eq!(a.stats().used, 0);
    assert_eq!(a.stats().pool.free, 3);
}

/// Random acquire / grow / shrink / chunk / chain / connection / drop sequences: used,
/// in_flight, connection bytes and the pool's live count always return to 0, and
/// `used <= capacity` always holds.
#[test]
fn property_everything_comes_back() {
    for seed in 1..=200u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let cap = 1 + rng.below(100_000);
        let b = Budget::new(cap, 1 + rng.below(20) as u32, 0);
        let pool = ChunkPool::new(1 + rng.below(4096) as usize, rng.below(8) as usize);
        let mut permits: Vec<Permit> = Vec::new();
        let mut chunks: Vec<Chunk> = Vec::new();
        let mut chains: Vec<ChunkChain> = Vec::new();
        let mut conns: Vec<ConnCharge> = Vec::new();
        for _ in 0..300 {
            match rng.below(11) {
                0 | 1 => {
                    if let Ok(p) = b.try_acquire(rng.below(cap / 2 + 1)) {
                        permits.push(p);
                    }
                }
                2 if !permits.is_empty() => {
                    let i = rng.below(permits.len() as u64) as usize;
                    let _ = permits[i].grow(rng.below(cap / 4 + 1));
                }
                3 if !permits.is_empty() => {
                    let i = rng.below(permits.len() as u64) as usize;
                    let before = permits[i].bytes();
                    let n = rng.below(before + 10);
                    let got = permits[i].shrink(n);
                    assert!(got <= n && permits[i].bytes() >= permits[i].committed());
                }
                4 if !permits.is_empty() => {
                    let i = rng.below(permits.len() as u64) as usize;
                    if let Ok(c) = pool.alloc(&permits[i]) {
                        chunks.push(c);
                    }
                }
                5 if !permits.is_empty() => {
                    let i = rng.below(permits.len() as u64) as usize;
                    let mut ch = pool.chain(&permits[i]);
                    let data = vec![7u8; rng.below(10_000) as usize];
                    let before = ch.len();
                    match ch.push_bytes(&data) {
                        Ok(()) => assert_eq!(ch.len(), before + data.len()),
                        Err(_) => assert_eq!(ch.len(), before),
                    }
                    chains.push(ch);
                }
                6 if !permits.is_empty() => {
                    let i = rng.below(permits.len() as u64) as usize;
                    drop(permits.swap_remove(i));
                }
                7 if !chunks.is_empty() => {
                    let i = rng.below(chunks.len() as u64) as usize;
                    drop(chunks.swap_remove(i));
                }
                8 if !chains.is_empty() => {
                    let i = rng.below(chains.len() as u64) as usize;
                    drop(chains.swap_remove(i));
                }
                9 => {
                    if let Ok(c) = b.charge_connection(rng.below(cap / 8 + 1)) {
                        conns.push(c);
                    }
                }
                10 if !conns.is_empty() => {
                    let i = rng.below(conns.len() as u64) as usize;
                    drop(conns.swap_remove(i));
                }
                _ => {
                    // An error path: a permit moved into a closure that bails out with `?`.
                    if let Some(p) = permits.pop() {
                        let r: Result<(), Reject> = (|| {
                            p.grow(u64::MAX / 2)?;
                            Ok(())
                        })();
                        assert!(r.is_err());
                        drop(p);
                    }
                }
            }
            assert!(b.used() <= b.capacity(), "seed {seed}");
            assert!(b.in_flight() <= b.max_in_flight(), "seed {seed}");
            let held: u64 = permits.iter().map(Permit::bytes).sum();
            let conn_held: u64 = conns.iter().map(ConnCharge::bytes).sum();
            assert_eq!(b.connection_bytes(), conn_held, "seed {seed}");
            assert_eq!(b.connections() as usize, conns.len(), "seed {seed}");
            assert!(held + conn_held <= b.used(), "seed {seed}");
        }
        // Drop in a random interleaving of kinds.
        while !(permits.is_empty() && chunks.is_empty() && chains.is_empty() && conns.is_empty()) {
            match rng.below(4) {
                0 => drop(permits.pop()),
                1 => drop(chunks.pop()),
                2 => drop(conns.pop()),
                _ => drop(chains.pop()),
            }
        }
        assert_eq!(b.connection_bytes(), 0, "seed {seed}");
        assert_eq!((b.used(), b.in_flight()), (0, 0), "seed {seed}");
        assert_eq!(pool.stats().live, 0, "seed {seed}");
    }
}

/// Random waiters with random sizes, timeouts, hold times and cancellations in a real runtime:
/// FIFO grants never exceed the budget, and everything is returned at the end.
#[test]
fn property_queue_under_churn() {
    rt().block_on(async {
        for seed in 1..=5u64 {
            let mut rng = Rng(seed * 7919);
            let b = Budget::new(1000, 8, 16);
            let grants = Rc::new(RefCell::new(0u32));
            let mut handles = Vec::new();
            for _ in 0..60 {
                let (b2, g) = (b.clone(), grants.clone());
                let bytes = 1 + rng.below(600);
                let wait = Duration::from_millis(1 + rng.below(30));
                let hold = Duration::from_millis(rng.below(10));
                let cancel = Duration::from_millis(1 + rng.below(40));
                handles.push(monoio::spawn(async move {
                    let fut = async {
                        if let Ok(p) = b2.acquire_or_wait(bytes, wait).await {
                            *g.borrow_mut() += 1;
                            assert!(b2.used() <= b2.capacity());
                            monoio::time::sleep(hold).await;
                            drop(p);
                        }
                    };
                    // Some callers go away (client disconnect) mid-wait or mid-hold.
                    let _ = monoio::time::timeout(cancel, fut).await;
                }));
                if rng.below(3) == 0 {
                    monoio::time::sleep(Duration::from_millis(1)).await;
                }
            }
            for h in handles {
                h.await;
            }
            assert!(*grants.borrow() > 0);
            assert_eq!(
                (b.used(), b.in_flight(), b.queued()),
                (0, 0, 0),
                "seed {seed}"
            );
        }
    });
}
