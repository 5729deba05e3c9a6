use super::*;
use crate::config::Config;
use crate::forward::breaker::BreakerState;
use crate::util::rng::Rng;

const PROVIDERS: &str = r#"
[[provider]]
name = "a"
kind = "openai"
base_url = "http://127.0.0.1:9001/v1"

[[provider]]
name = "a2"
kind = "openai-compatible"
base_url = "http://127.0.0.1:9003/v1"

[[provider]]
name = "b"
kind = "anthropic"
base_url = "http://127.0.0.1:9002"
"#;

fn table(models: &str) -> RouteTable {
    let text = format!("{PROVIDERS}\n{models}");
    match Config::parse(&text) {
        Ok(cfg) => RouteTable::build(&cfg),
        Err(e) => panic!("{e:?}"),
    }
}

/// `table(models)` and one shard's forwarding state over it.
fn routed(models: &str) -> (RouteTable, ForwardState) {
    let t = table(models);
    let st = ForwardState::new(&t, 1);
    (t, st)
}

/// The plan of a request for `model` (it must route) starting at `now`.
fn attempts<'a>(
    t: &'a RouteTable,
    st: &'a ForwardState,
    model: &'a str,
    now: Instant,
) -> Attempts<'a> {
    Attempts::new(t, st, t.resolve(model).unwrap(), model, now)
}

fn ms(t0: Instant, n: u64) -> Instant {
    t0 + Duration::from_millis(n)
}

/// (deployment label, upstream model, attempt number) of a `Try`, or panic.
fn tried(step: &Step<'_>) -> (String, String, u32) {
    match step {
        Step::Try(c) => (
            c.deployment.label.clone(),
            c.upstream_model.to_string(),
            c.attempt,
        ),
        other => panic!("expected Try, got {other:?}"),
    }
}

fn take(step: Step<'_>) -> Candidate<'_> {
    match step {
        Step::Try(c) => c,
        other => panic!("expected Try, got {other:?}"),
    }
}

const CONTRACT_MODELS: &str = r#"
[[model]]
name = "gpt-4o-mini"
deployments = [
  { provider = "a", upstream_model = "gpt-4o-mini", weight = 3 },
  { provider = "a2", upstream_model = "gpt-4o-mini", weight = 1 },
]
lb = "weighted"
fallbacks = ["claude-3-5-haiku"]
max_attempts = 5

[[model]]
name = "claude-*"
provider = "b"
"#;

#[test]
fn order_is_same_model_first_then_fallbacks() {
    let (t, st) = routed(CONTRACT_MODELS);
    let t0 = Instant::now();
    let mut plan = attempts(&t, &st, "gpt-4o-mini", t0);
    let s = plan.next(t0);
    assert_eq!(tried(&s), ("a/gpt-4o-mini".into(), "gpt-4o-mini".into(), 1));
    let s = plan.failed(take(s), Reason::Status503, None, ms(t0, 1));
    assert_eq!(
        tried(&s),
        ("a2/gpt-4o-mini".into(), "gpt-4o-mini".into(), 2)
    );
    let s = plan.failed(take(s), Reason::Connect, None, ms(t0, 2));
    // the fallback is a prefix model: the fallback's name is what goes upstream
    assert_eq!(
        tried(&s),
        ("b/claude-*".into(), "claude-3-5-haiku".into(), 3)
    );
    let c = take(s);
    assert_eq!(
        c.fallback.map(|f| f.name.as_str()),
        Some("claude-3-5-haiku")
    );
    let s = plan.failed(c, Reason::Status500, None, ms(t0, 3));
    assert!(matches!(s, Step::Stop(Stop::Exhausted)), "{s:?}");
    assert_eq!(plan.attempts(), 3);
    let m = &st.metrics;
    assert_eq!(m.retries(0, Reason::Status503), 1);
    assert_eq!(m.retries(0, Reason::Connect), 1);
    assert_eq!(
        m.retries(0, Reason::Status500),
        0,
        "nothing left to retry on"
    );
    assert_eq!(m.fallbacks(0, 0), 1);
    assert_eq!(m.failures(1, 0, Reason::Status500), 1);
}

#[test]
fn success_on_the_first_try_and_weights_across_requests() {
    let (t, st) = routed(CONTRACT_MODELS);
    let t0 = Instant::now();
    let mut firsts = Vec::new();
    for i in 0..8 {
        let mut plan = attempts(&t, &st, "gpt-4o-mini", ms(t0, i));
        let c = take(plan.next(ms(t0, i)));
        plan.succeeded(&c, ms(t0, i + 1));
        firsts.push(c.deployment_index);
    }
    assert_eq!(firsts, [0, 0, 1, 0, 0, 0, 1, 0]);
    assert_eq!(st.metrics.attempts(0, 0), 6);
}

#[test]
fn max_attempts_deadline_and_retry_on_bound_the_plan() {
    let models = r#"
[[model]]
name = "m"
deployments = [{ provider = "a" }, { provider = "a2" }, { provider = "b" }]
lb = "weighted"
max_attempts = 2
retry_on = ["503", "connect"]
timeout_ms = 1000
"#;
    let (t, st) = routed(models);
    let t0 = Instant::now();

    let mut plan = attempts(&t, &st, "m", t0);
    let c = take(plan.next(t0));
    let c = take(plan.failed(c, Reason::Status503, None, ms(t0, 1)));
    let s = plan.failed(c, Reason::Connect, None, ms(t0, 2));
    assert!(matches!(s, Step::Stop(Stop::Attempts)), "{s:?}");

    let mut plan = attempts(&t, &st, "m", t0);
    let c = take(plan.next(t0));
    let s = plan.failed(c, Reason::Status502, None, ms(t0, 1));
    assert!(
        matches!(s, Step::Stop(Stop::NotRetryable(Reason::Status502))),
        "{s:?}"
    );

    let mut plan = attempts(&t, &st, "m", t0);
    assert_eq!(
        plan.attempt_timeout(ms(t0, 400)),
        Duration::from_millis(600)
    );
    let c = take(plan.next(t0));
    let s = plan.failed(c, Reason::Status503, None, ms(t0, 1_000));
    assert!(matches!(s, Step::Stop(Stop::Deadline)), "{s:?}");
}

#[test]
fn open_breakers_are_skipped_and_probed_after_the_cooldown() {
    let models = r#"
[[model]]
name = "m"
deployments = [{ provider = "a", weight = 100 }, { provider = "a2" }]
lb = "weighted"
breaker = { failures = 2, cooldown_ms = 1000 }
"#;
    let (t, st) = routed(models);
    let t0 = Instant::now();
    // two requests whose first attempt on "a" fails open its breaker
    for i in 0..2 {
        let mut plan = attempts(&t, &st, "m", ms(t0, i));
        let c = take(plan.next(ms(t0, i)));
        assert_eq!(c.deployment_index, 0);
        let c = take(plan.failed(c, Reason::Status500, None, ms(t0, i)));
        assert_eq!(c.deployment_index, 1);
        plan.succeeded(&c, ms(t0, i + 1));
    }
    let ms0 = st.model(0).unwrap();
    assert_eq!(ms0.breakers[0].state(), BreakerState::Open);
    for i in 2..50 {
        let mut plan = attempts(&t, &st, "m", ms(t0, i));
        assert_eq!(take(plan.next(ms(t0, i))).deployment_index, 1);
    }
    // after the cooldown: one probe on "a"; a concurrent request goes to "a2"
    let now = ms(t0, 1_001);
    let mut p1 = attempts(&t, &st, "m", now);
    let probe = take(p1.next(now));
    assert_eq!(probe.deployment_index, 0);
    let mut p2 = attempts(&t, &st, "m", now);
    assert_eq!(take(p2.next(now)).deployment_index, 1);
    // the probe's client went away: dropping it frees the slot
    drop(probe);
    let mut p3 = attempts(&t, &st, "m", now);
    let probe = take(p3.next(now));
    assert_eq!(probe.deployment_index, 0);
    // a probe answered 429: no verdict; once its key cooled (1 s default) the next may probe
    let probe = take(p3.failed(probe, Reason::Status429, None, ms(t0, 1_002)));
    assert_eq!(probe.deployment_index, 1, "p3 moves on");
    drop(probe);
    let mut p4 = attempts(&t, &st, "m", ms(t0, 1_500));
    assert_eq!(
        take(p4.next(ms(t0, 1_500))).deployment_index,
        1,
        "key cooling"
    );
    let now = ms(t0, 2_002);
    let mut p5 = attempts(&t, &st, "m", now);
    let probe = take(p5.next(now));
    assert_eq!(probe.deployment_index, 0);
    assert_eq!(ms0.breakers[0].state(), BreakerState::HalfOpen);
    p5.succeeded(&probe, ms(t0, 2_010));
    assert_eq!(ms0.breakers[0].state(), BreakerState::Closed);
    assert_eq!(st.metrics.failures(0, 0, Reason::Status500), 2);
}

#[test]
fn a_429_cools_the_key_moves_on_and_waits_only_within_the_deadline() {
    let models = r#"
[[model]]
name = "m"
deployments = [{ provider = "a" }, { provider = "a2" }]
lb = "weighted"
max_attempts = 5
timeout_ms = 10000
max_retry_wait_ms = 3000
"#;
    let (t, st) = routed(models);
    let t0 = Instant::now();
    let mut plan = attempts(&t, &st, "m", t0);
    let c = take(plan.next(t0));
    assert_eq!(c.deployment_index, 0);
    let s = plan.failed(c, Reason::Status429, Some(Duration::from_secs(2)), t0);
    let c = take(s);
    assert_eq!(c.deployment_index, 1, "moves on at once, no waiting");
    // the other one fails too: wait for the cooled key (2 s < 10 s deadline)
    let s = plan.failed(c, Reason::Status503, None, ms(t0, 5));
    assert!(matches!(s, Step::Wait(u) if u == ms(t0, 2_000)), "{s:?}");
    // a new request meanwhile skips the cooling provider
    let mut other = attempts(&t, &st, "m", ms(t0, 10));
    assert_eq!(take(other.next(ms(t0, 10))).deployment_index, 1);
    assert!(st.keys(0).unwrap().is_cooling(0, 0, ms(t0, 1_999)));
    let s = plan.next(ms(t0, 2_000));
    assert_eq!(take(s).deployment_index, 0);

    // the waits of one request add up: 2 s waited, 1.5 s more would pass the 3 s
    let (one, st1) = routed("[[model]]\nname = \"one\"\nprovider = \"a\"\nmax_attempts = 5\ntimeout_ms = 10000\nmax_retry_wait_ms = 3000\n");
    let mut plan = attempts(&one, &st1, "one", t0);
    let c = take(plan.next(t0));
    let s = plan.failed(c, Reason::Status429, Some(Duration::from_secs(2)), t0);
    assert!(matches!(s, Step::Wait(u) if u == ms(t0, 2_000)), "{s:?}");
    let c = take(plan.next(ms(t0, 2_000)));
    let s = plan.failed(
        c,
        Reason::Status429,
        Some(Duration::from_millis(1_500)),
        ms(t0, 2_000),
    );
    assert!(matches!(s, Step::Stop(Stop::Exhausted)), "{s:?}");

    // with the default max_retry_wait_ms (1 s) a 2 s Retry-After is the client's to wait
    let (t1, st) = routed(&models.replace("max_retry_wait_ms = 3000\n", ""));
    let route1 = t1.resolve("m").unwrap();
    assert_eq!(route1.policy.max_retry_wait, Duration::from_secs(1));
    let mut plan = attempts(&t1, &st, "m", t0);
    let c = take(plan.next(t0));
    let c = take(plan.failed(c, Reason::Status429, Some(Duration::from_secs(2)), t0));
    let s = plan.failed(c, Reason::Status503, None, ms(t0, 5));
    assert!(matches!(s, Step::Stop(Stop::Exhausted)), "{s:?}");
    // one of 1 s is still waited on
    let mut plan = attempts(&t1, &st, "m", ms(t0, 10));
    let s = plan.next(ms(t0, 10));
    assert!(matches!(s, Step::Try(_)), "{s:?}");
    let c = take(s);
    assert_eq!(c.deployment_index, 1, "a still cools for 2 s");
    let s = plan.failed(
        c,
        Reason::Status429,
        Some(Duration::from_millis(900)),
        ms(t0, 20),
    );
    assert!(matches!(s, Step::Wait(u) if u == ms(t0, 920)), "{s:?}");

    // Retry-After beyond the deadline is not waited on
    let st = ForwardState::new(&t, 1);
    let mut plan = attempts(&t, &st, "m", t0);
    let c = take(plan.next(t0));
    let c = take(plan.failed(c, Reason::Status429, Some(Duration::from_secs(60)), t0));
    let s = plan.failed(c, Reason::Status503, None, ms(t0, 5));
    assert!(matches!(s, Step::Stop(Stop::Exhausted)), "{s:?}");

    // nor one that would leave the attempt after it less than its first-byte timeout (here
    // the default 300 s, so at most half the 10 s deadline): 6 s + 5 s > 10 s
    let st = ForwardState::new(&t, 1);
    let mut plan = attempts(&t, &st, "m", t0);
    let c = take(plan.next(t0));
    let c = take(plan.failed(c, Reason::Status429, Some(Duration::from_secs(6)), t0));
    let s = plan.failed(c, Reason::Status503, None, ms(t0, 5));
    assert!(matches!(s, Step::Stop(Stop::Exhausted)), "{s:?}");
}

#[test]
fn a_429_on_one_key_retries_the_same_deployment_with_another_key() {
    std::env::set_var("RINGGATE_PLAN_TEST_K1", "k1");
    std::env::set_var("RINGGATE_PLAN_TEST_K2", "k2");
    let text = r#"
[[provider]]
name = "p"
kind = "openai"
base_url = "http://127.0.0.1:9001/v1"
api_keys = [{ env = "RINGGATE_PLAN_TEST_K1", weight = 2 }, { env = "RINGGATE_PLAN_TEST_K2" }]

[[model]]
name = "m"
provider = "p"
"#;
    let t = RouteTable::build(&Config::parse(text).unwrap());
    let st = ForwardState::new(&t, 1);
    let t0 = Instant::now();
    let mut plan = attempts(&t, &st, "m", t0);
    let c = take(plan.next(t0));
    assert_eq!(c.key, 0);
    assert_eq!(c.auth_headers(), b"authorization: Bearer k1\r\n");
    let c = take(plan.failed(c, Reason::Status429, Some(Duration::from_secs(5)), t0));
    assert_eq!((c.deployment_index, c.key), (0, 1));
    assert_eq!(c.auth_headers(), b"authorization: Bearer k2\r\n");
    assert_eq!(c.attempt, 2);
}

#[test]
fn fallbacks_chain_breadth_first_and_dropping_candidates_ends_in_flight() {
    let models = r#"
[[model]]
name = "m"
provider = "a"
fallbacks = ["f1", "f2"]
max_attempts = 10

[[model]]
name = "f1"
provider = "a2"
fallbacks = ["f3"]

[[model]]
name = "f2"
provider = "b"
fallbacks = ["f3"]

[[model]]
name = "f3"
provider = "b"
upstream_model = "real-f3"
"#;
    let t = table(models);
    let route = t.resolve("m").unwrap();
    let chain: Vec<&str> = route.chain.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(chain, ["f1", "f2", "f3"]);
    let st = ForwardState::new(&t, 1);
    let t0 = Instant::now();
    let mut plan = attempts(&t, &st, "m", t0);
    let mut seen = Vec::new();
    let mut step = plan.next(t0);
    while let Step::Try(c) = step {
        seen.push(format!("{}:{}", c.route.name, c.upstream_model));
        let b = &st.model(c.route.index).unwrap().balancer;
        assert_eq!(b.in_flight(0), u32::from(b.learns()));
        step = plan.failed(c, Reason::Reset, None, t0);
    }
    assert_eq!(seen, ["m:m", "f1:f1", "f2:f2", "f3:real-f3"]);
    for r in 0..4 {
        assert_eq!(st.model(r).unwrap().balancer.in_flight(0), 0);
    }
    assert_eq!((0..3).map(|p| st.metrics.fallbacks(0, p)).sum::<u64>(), 3);
}

/// Property-style: random outcomes over many requests with a seeded PRNG; every plan
/// respects max_attempts, never repeats a deployment unless it was rate limited, only falls
/// back when no deployment of the requested model was eligible, and leaves nothing in flight.
#[test]
fn random_outcomes_keep_the_invariants() {
    for seed in [7, 1, 2, 3, 4] {
        random_outcomes(seed);
    }
}

fn random_outcomes(seed: u64) {
    let models = r#"
[[model]]
name = "m"
deployments = [{ provider = "a", weight = 2 }, { provider = "a2" }, { provider = "b", upstream_model = "x" }]
fallbacks = ["f"]
max_attempts = 4
breaker = { failures = 3, cooldown_ms = 500 }

[[model]]
name = "f"
deployments = [{ provider = "b" }, { provider = "a" }]
"#;
    let t = table(models);
    let st = ForwardState::new(&t, seed * 31);
    let rng = Rng::new(seed);
    let route = t.resolve("m").unwrap();
    // connect … 500 (the first six), and 503
    let reasons = [&Reason::ALL[..6], &[Reason::Status503]].concat();
    let t0 = Instant::now();
    let mut now = t0;
    let mut outcomes = [0u32; 3]; // success, stop, waited
    for _ in 0..3_000 {
        now += Duration::from_millis(rng.below(20) as u64);
        let mut plan = attempts(&t, &st, "m", now);
        let mut seen: Vec<(usize, usize)> = Vec::new();
        let mut limited: Vec<(usize, usize)> = Vec::new();
        let mut step = plan.next(now);
        loop {
            match step {
                Step::Try(c) => {
                    let id = (c.route.index, c.deployment_index);
                    assert!(c.attempt <= 4);
                    assert!(
                        !seen.contains(&id) || limited.contains(&id),
                        "{id:?} repeated without a 429: {seen:?}"
                    );
                    if c.route.index != route.index {
                        // falling back: no deployment of "m" could be picked right now
                        let ms = st.model(route.index).unwrap();
                        for d in 0..3 {
                            let avail = ms.breakers[d].available(now)
                                && !st
                                    .keys(route.deployments[d].provider.index)
                                    .unwrap()
                                    .is_cooling(0, 0, now);
                            assert!(
                                !avail || seen.contains(&(route.index, d)),
                                "fell back early"
                            );
                        }
                    }
                    seen.push(id);
                    if rng.below(3) == 0 {
                        plan.succeeded(&c, now + Duration::from_millis(5));
                        outcomes[0] += 1;
                        break;
                    }
                    let reason = reasons[rng.below(reasons.len())];
                    if reason == Reason::Status429 {
                        limited.push(id);
                    }
                    let ra = Some(Duration::from_millis(rng.below(300) as u64));
                    step = plan.failed(c, reason, ra, now);
                }
                Step::Wait(until) => {
                    assert!(until < plan.deadline() && until > now);
                    outcomes[2] += 1;
                    now = until;
                    step = plan.next(now);
                }
                Step::Stop(_) => {
                    outcomes[1] += 1;
                    break;
                }
            }
        }
        assert!(plan.attempts() <= 4 && seen.len() == plan.attempts() as usize);
        for r in 0..2 {
            for d in 0..t.route(r).unwrap().deployments.len() {
                assert_eq!(st.model(r).unwrap().balancer.in_flight(d), 0);
            }
        }
    }
    assert!(outcomes.iter().all(|&n| n > 0), "{outcomes:?}");
}
