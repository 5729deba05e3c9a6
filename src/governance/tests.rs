//! Governance decisions without sockets: identify → admit → check_model → drop.

use super::*;
use crate::config::provider::Op;
use crate::config::Config;
use crate::http::head::parse;

const HEX_TEST: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

fn gov(key_extra: &str) -> Governance {
    let text = format!("[[key]]\nname = \"team-a\"\nkey_sha256 = \"{HEX_TEST}\"\n{key_extra}\n");
    let cfg = Config::parse(&text).unwrap();
    Governance::new(Keyring::build(&cfg).unwrap(), 0)
}

/// The header lines `h` as text, after asserting each of `lines` is one of them.
fn has_lines(h: &[u8], lines: &[&str]) -> String {
    let text = String::from_utf8(h.to_vec()).unwrap();
    for l in lines {
        assert!(text.contains(&format!("{l}\r\n")), "{l:?} not in {text}");
    }
    text
}

/// Four routes (`m0`..`m2`, `gpt-4o-mini` at index 3), the last priced.
fn routes() -> crate::route::RouteTable {
    let cfg = Config::parse(
        "[[provider]]\nname = \"p\"\nkind = \"mock\"\n[[model]]\nname = \"m0\"\nprovider = \"p\"\n[[model]]\nname = \"m1\"\nprovider = \"p\"\n[[model]]\nname = \"m2\"\nprovider = \"p\"\n[[model]]\nname = \"gpt-4o-mini\"\nprovider = \"p\"\nprice_input_per_mtok = 1.0\nprice_output_per_mtok = 2.0\n",
    )
    .unwrap();
    crate::route::RouteTable::build(&cfg)
}

fn fields(body: &[u8]) -> crate::dialect::extract::RoutingFields {
    crate::dialect::extract::routing_fields(body).unwrap()
}

fn caller(g: &Governance, header: &str) -> Caller {
    let raw = format!("POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\n{header}\r\n\r\n");
    let h = parse(raw.as_bytes(), 4096, 64).unwrap().unwrap();
    g.identify(&h, raw.as_bytes())
}

#[test]
fn keys_off_identifies_nobody_and_admits_everything() {
    let g = Governance::off();
    assert_eq!(caller(&g, "X-A: b"), Caller::Open);
    let mut h = Vec::new();
    assert!(g
        .admit(Caller::Open, Gate::Limits, &mut h)
        .unwrap()
        .is_none());
    assert!(h.is_empty());
}

#[test]
fn missing_unknown_and_valid_keys() {
    let g = gov("");
    assert_eq!(caller(&g, "X-A: b"), Caller::Missing);
    assert_eq!(caller(&g, "Authorization: Bearer nope"), Caller::Unknown);
    assert_eq!(caller(&g, "Authorization: Bearer test"), Caller::Key(0));
    assert_eq!(caller(&g, "x-api-key: test"), Caller::Key(0));
    let mut h = Vec::new();
    for c in [Caller::Missing, Caller::Unknown, Caller::Ambiguous] {
        let e = g.admit(c, Gate::Limits, &mut h).unwrap_err();
        assert_eq!(e.status(), 401);
        assert!(!e.message.contains("nope"), "{e}");
        assert_eq!(g.admit(c, Gate::Key, &mut h).unwrap_err().status(), 401);
        // health and metrics need nothing
        assert!(g.admit(c, Gate::Open, &mut h).unwrap().is_none());
    }
    assert!(g
        .admit(Caller::Key(0), Gate::Limits, &mut h)
        .unwrap()
        .is_some());
    assert!(h.is_empty(), "no limits, no rate headers");
}

#[test]
fn disabled_and_expired_keys_are_refused_by_name() {
    let g = gov("enabled = false");
    let e = g
        .admit(Caller::Key(0), Gate::Key, &mut Vec::new())
        .unwrap_err();
    assert_eq!(e.status(), 401);
    assert!(e.message.contains("team-a") && e.message.contains("disabled"));
    let g = gov("expires = 2001-01-01T00:00:00Z");
    let e = g
        .admit(Caller::Key(0), Gate::Limits, &mut Vec::new())
        .unwrap_err();
    assert!(e.message.contains("expired"), "{e}");
    let g = gov("expires = 2999-01-01T00:00:00Z");
    assert!(g
        .admit(Caller::Key(0), Gate::Limits, &mut Vec::new())
        .is_ok());
}

#[test]
fn rpm_and_in_flight_on_the_head_with_headers() {
    let g = gov("rpm = 2\nmax_in_flight = 1");
    let mut h = Vec::new();
    let first = g.admit(Caller::Key(0), Gate::Limits, &mut h).unwrap();
    let text = has_lines(
        &h,
        &[
            "x-ratelimit-limit-requests: 2",
            "x-ratelimit-remaining-requests: 1",
            "x-ratelimit-reset-requests: 60s",
        ],
    );
    assert!(!text.contains("tokens"), "{text}");
    // a second one while the first is in flight
    h.clear();
    let e = g.admit(Caller::Key(0), Gate::Limits, &mut h).unwrap_err();
    assert_eq!((e.status(), e.retry_after_secs()), (429, Some(1)));
    assert!(e.message.contains("in flight"));
    drop(first);
    h.clear();
    drop(g.admit(Caller::Key(0), Gate::Limits, &mut h).unwrap());
    h.clear();
    let e = g.admit(Caller::Key(0), Gate::Limits, &mut h).unwrap_err();
    assert_eq!(e.status(), 429);
    assert!(e.message.contains("2 requests per minute"), "{e}");
    let secs = e.retry_after_secs().unwrap();
    assert!((59..=60).contains(&secs), "{secs}");
    let text = has_lines(&h, &["x-ratelimit-remaining-requests: 0"]);
    assert_eq!(
        text.matches("x-ratelimit-limit-requests").count(),
        1,
        "{text}"
    );
    assert_eq!(g.metrics.requests(0, 0), 0);
}

#[test]
fn model_allow_list_and_tokens_after_the_body() {
    let rt = routes();
    let book = std::sync::Arc::new(SpendBook::new());
    let g = gov("models = [\"gpt-4o-mini\"]\ntpm = 100").with_spend(&book, &rt);
    let (r0, r3) = (rt.route(0).unwrap(), rt.route(3).unwrap());
    let mut h = Vec::new();
    let mut grant = g
        .admit(Caller::Key(0), Gate::Limits, &mut h)
        .unwrap()
        .unwrap();
    let other = fields(br#"{"model":"gpt-4o"}"#);
    let e = grant
        .check_model(&other, r0, Op::Generate, 20, &mut h)
        .unwrap_err();
    assert_eq!(e.status(), 403);
    let body = br#"{"model":"gpt-4o-mini","max_tokens":50,"messages":[]}"#; // 13 + 50
    grant
        .check_model(&fields(body), r3, Op::Generate, body.len(), &mut h)
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&h)
            .matches("x-ratelimit-limit-tokens")
            .count(),
        1
    );
    let want = 100 - (body.len() as u64 / 4 + 50);
    has_lines(&h, &[&format!("x-ratelimit-remaining-tokens: {want}")]);
    assert_eq!(g.requests(0, 3), 1);
    // the answer reported 20 tokens: the reservation shrinks to that when the request ends
    let mut head = crate::upstream::ResponseHead {
        status: 200,
        framing: crate::upstream::RespFraming::Length(0),
        keep_alive: true,
        content_type: Vec::new().into(),
        forward: b"x-ratelimit-remaining-tokens: 7\r\n".to_vec(),
    };
    grant.on_answer(&mut head, None, crate::dialect::Dialect::Chat);
    assert!(
        head.forward.is_empty(),
        "the provider's rate headers are dropped"
    );
    grant
        .usage()
        .feed(br#"{"usage":{"prompt_tokens":15,"completion_tokens":5,"total_tokens":20}}"#);
    drop(grant);
    let tpm = &g.counters.slot(0).tpm;
    assert_eq!(tpm.used(g.counters.now()), 20);
    // recorded at the model's price: 15 × 1 µUSD + 5 × 2 µUSD
    assert_eq!(g.usage(0, 3), (15, 5, 25_000));
    let rows = book.snapshot();
    assert_eq!(rows.len(), 1);
    assert_eq!(
        (rows[0].key.as_str(), rows[0].model.as_str()),
        ("team-a", "gpt-4o-mini")
    );
    assert_eq!(
        (
            rows[0].requests,
            rows[0].input_tokens,
            rows[0].output_tokens
        ),
        (1, 15, 5)
    );
    assert_eq!(rows[0].spend_nanos, 25_000);
    // a request over what is left: 429 with the window's reset
    let mut grant = g
        .admit(Caller::Key(0), Gate::Limits, &mut h)
        .unwrap()
        .unwrap();
    let big = br#"{"model":"gpt-4o-mini","max_tokens":80}"#;
    let e = grant
        .check_model(&fields(big), r3, Op::Generate, big.len(), &mut h)
        .unwrap_err();
    assert_eq!(e.status(), 429);
    assert!(e.retry_after_secs().unwrap() >= 59);
    drop(grant);
    // an error answer without usage gives the reservation back
    let mut grant = g
        .admit(Caller::Key(0), Gate::Limits, &mut h)
        .unwrap()
        .unwrap();
    let small = br#"{"model":"gpt-4o-mini","max_tokens":10}"#;
    grant
        .check_model(&fields(small), r3, Op::Generate, small.len(), &mut h)
        .unwrap();
    head.status = 502;
    grant.on_answer(&mut head, None, crate::dialect::Dialect::Chat);
    drop(grant);
    assert_eq!(tpm.used(g.counters.now()), 20);
    assert_eq!(
        book.snapshot()[0].requests,
        1,
        "error answers are not recorded"
    );
}

#[test]
fn limits_are_per_key_across_the_shards_of_a_process() {
    // two shards' views of one keyring, sharing the process's counters
    let text = format!(
        "[[key]]\nname = \"team-a\"\nkey_sha256 = \"{HEX_TEST}\"\nrpm = 3\nmax_in_flight = 2\n"
    );
    let ring = Keyring::build(&Config::parse(&text).unwrap()).unwrap();
    let counters = std::sync::Arc::new(Counters::new());
    let a = Governance::new(ring.clone(), 0).with_counters(counters.clone());
    let b = Governance::new(ring, 1).with_counters(counters);
    let mut h = Vec::new();
    let one = a.admit(Caller::Key(0), Gate::Limits, &mut h).unwrap();
    h.clear();
    let two = b.admit(Caller::Key(0), Gate::Limits, &mut h).unwrap();
    has_lines(
        &h,
        &[
            "x-ratelimit-limit-requests: 3",
            "x-ratelimit-remaining-requests: 1",
        ],
    );
    // a third in flight on either shard: refused (the limit is the key's, not a shard's)
    for g in [&a, &b] {
        h.clear();
        let e = g.admit(Caller::Key(0), Gate::Limits, &mut h).unwrap_err();
        assert!(e.message.contains("2 requests in flight"), "{e}");
    }
    drop(one);
    drop(two);
    h.clear();
    drop(b.admit(Caller::Key(0), Gate::Limits, &mut h).unwrap());
    h.clear();
    let e = a.admit(Caller::Key(0), Gate::Limits, &mut h).unwrap_err();
    assert!(e.message.contains("3 requests per minute"), "{e}");
    // the refused requests gave their in-flight slots back
    assert_eq!(a.counters.slot(0).in_flight(), 0);
}

#[test]
fn one_request_per_minute_says_so() {
    let g = gov("rpm = 1\nmax_in_flight = 1");
    let mut h = Vec::new();
    drop(g.admit(Caller::Key(0), Gate::Limits, &mut h).unwrap());
    let e = g.admit(Caller::Key(0), Gate::Limits, &mut h).unwrap_err();
    assert!(e.message.contains("1 request per minute is"), "{e}");
}

#[test]
fn a_budget_is_reserved_while_requests_are_in_flight() {
    let rt = routes();
    let book = std::sync::Arc::new(SpendBook::new());
    // gpt-4o-mini: 1 µUSD per input token, 2 per output token; a request estimated at
    // body/4 input + 100 output tokens
    let g = gov("budget_usd = 0.0005").with_spend(&book, &rt);
    let r3 = rt.route(3).unwrap();
    let body = br#"{"model":"gpt-4o-mini","max_tokens":100,"messages":[]}"#;
    let est = (body.len() as u64 / 4) * 1000 + 100 * 2000;
    let mut h = Vec::new();
    // four pass the head at once (nothing is reserved yet), then read their bodies
    let mut held: Vec<Grant<'_>> = (0..4)
        .map(|_| {
            g.admit(Caller::Key(0), Gate::Limits, &mut h)
                .unwrap()
                .unwrap()
        })
        .collect();
    let mut refused = Vec::new();
    held.retain_mut(|grant| {
        match grant.check_model(&fields(body), r3, Op::Generate, body.len(), &mut h) {
            Ok(()) => true,
            Err(e) => {
                refused.push(e);
                false
            }
        }
    });
    // admitted while spend + reservations were under the budget: ceil(500 µUSD / estimate)
    assert_eq!(
        held.len() as u64,
        500_000u64.div_ceil(est),
        "estimate {est}"
    );
    assert_eq!(refused.len(), 1);
    assert_eq!(refused[0].status(), 429);
    assert!(
        refused[0].message.contains("reserved the rest"),
        "{}",
        refused[0]
    );
    let l = book.get("team-a").unwrap();
    assert_eq!(l.reserved(), est * held.len() as u64);
    // the head refuses too while they are in flight
    assert!(g.admit(Caller::Key(0), Gate::Limits, &mut h).is_err());
    // each ends having cost less than its estimate (50 output tokens): spend recorded, the
    // reservation given back
    for mut grant in held {
        let mut head = crate::upstream::ResponseHead {
            status: 200,
            framing: crate::upstream::RespFraming::Length(0),
            keep_alive: true,
            content_type: Vec::new().into(),
            forward: Vec::new(),
        };
        grant.on_answer(&mut head, None, crate::dialect::Dialect::Chat);
        grant
            .usage()
            .feed(br#"{"usage":{"prompt_tokens":0,"completion_tokens":50,"total_tokens":50}}"#);
    }
    assert_eq!(l.reserved(), 0);
    assert_eq!(
        l.spent(spend::unix_now()),
        100_000 * 500_000u64.div_ceil(est)
    );
    // a failed request gives its reservation back without spending
    let mut grant = g
        .admit(Caller::Key(0), Gate::Limits, &mut h)
        .unwrap()
        .unwrap();
    grant
        .check_model(&fields(body), r3, Op::Generate, body.len(), &mut h)
        .unwrap();
    assert_eq!(l.reserved(), est);
    drop(grant);
    assert_eq!(l.reserved(), 0);
}

#[test]
fn a_directory_change_visits_only_the_slots_it_set() {
    use super::registry::Registry;
    let body = |t: &str| {
        serde_json::from_str::<serde_json::Value>(t)
            .unwrap()
            .as_object()
            .unwrap()
            .clone()
    };
    let (mut reg, _) = Registry::build(&Config::parse("").unwrap(), &[], None).unwrap();
    let mut secrets = Vec::new();
    for i in 0..3_000 {
        let (_, s) = reg
            .create(&body(&format!(r#"{{"name":"k{i}"}}"#)), 1)
            .unwrap();
        secrets.push(s);
    }
    let g = Governance::follow(reg.directory(), true, 0);
    assert_eq!(g.installed.get(), 3_000, "the first view: every slot");
    let bearer = |s: &str| format!("Authorization: Bearer {s}");
    assert_eq!(caller(&g, &bearer(&secrets[2_999])), Caller::Key(2_999));
    // three changes between two requests: the next request applies those three slots only
    let (_, fresh) = reg.create(&body(r#"{"name":"new"}"#), 2).unwrap();
    reg.patch("k5", &body(r#"{"enabled":false}"#), 3).unwrap();
    reg.revoke("k6", 4).unwrap();
    assert_eq!(caller(&g, &bearer(&fresh)), Caller::Key(3_000));
    assert_eq!(g.installed.get(), 3);
    assert_eq!(caller(&g, &bearer(&secrets[6])), Caller::Unknown);
    assert_eq!(caller(&g, &bearer(&secrets[7])), Caller::Key(7));
    let mut h = Vec::new();
    let e = g.admit(Caller::Key(5), Gate::Limits, &mut h).unwrap_err();
    assert!(e.message.contains("disabled"), "{e}");
    assert!(g.admit(Caller::Key(3_000), Gate::Limits, &mut h).is_ok());
}
