//! `/metrics` content: requests counted under the right endpoint, model, provider and status
//! class; histograms whose buckets are cumulative and whose counts equal the requests sent;
//! every family with `# HELP` and `# TYPE`; `promtool check metrics` on scrapes taken while
//! load runs on two shards (skipped with a message when promtool is not installed; CI installs
//! it).

#[path = "../common/mod.rs"]
mod common;

use std::collections::BTreeMap;
use std::io::Write;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use ringgate::mock::Profile;

/// One sample: name, labels, value.
#[derive(Debug, Clone)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// Parse the text format (the gateway's own output: no timestamps, simple label values).
/// Family name → (has `# HELP`, `# TYPE`).
type Meta = BTreeMap<String, (bool, Option<String>)>;
/// (family, labels without `le`) → [(le, cumulative count)].
type Buckets = BTreeMap<(String, BTreeMap<String, String>), Vec<(f64, f64)>>;

fn parse(text: &str) -> (Vec<Sample>, Meta) {
    let mut samples = Vec::new();
    // family → (has HELP, TYPE)
    let mut meta = Meta::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let name = rest.split(' ').next().unwrap();
            assert!(
                !meta.get(name).is_some_and(|m| m.0),
                "second HELP for {name}"
            );
            meta.entry(name.into()).or_default().0 = true;
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            let m = meta.entry(name.into()).or_default();
            assert!(m.1.is_none(), "second TYPE for {name}");
            m.1 = Some(kind.into());
            continue;
        }
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').unwrap();
        let (name, labels) = match series.split_once('{') {
            Some((n, l)) => (n, l.strip_suffix('}').unwrap()),
            None => (series, ""),
        };
        let mut map = BTreeMap::new();
        for pair in labels.split("\",").filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once("=\"").unwrap();
            map.insert(k.to_string(), v.trim_end_matches('"').to_string());
        }
        let value = match value {
            "+Inf" => f64::INFINITY,
            v => v
                .parse()
                .unwrap_or_else(|_| panic!("bad value in {line:?}")),
        };
        samples.push(Sample {
            name: name.into(),
            labels: map,
            value,
        });
    }
    (samples, meta)
}

/// A gateway with two shards in front of `upstream` (models as in `start_gateway`), the response
/// cache on for `gpt-4o-mini` (its families in every scrape; requests without a key skip it).
fn two_shards(upstream: SocketAddr) -> ringgate::server::Running {
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nshards = 2\npin = false\ndriver = \"epoll\"\n\
         [cache]\nenabled = true\n\
         [[provider]]\nname = \"local\"\nkind = \"openai\"\nbase_url = \"http://{upstream}/v1\"\n\
         [[model]]\nname = \"gpt-4o-mini\"\nprovider = \"local\"\ncache = \"exact\"\n\
         [[model]]\nname = \"alias\"\nprovider = \"local\"\nupstream_model = \"real-model\"\n"
    );
    ringgate::server::start(ringgate::config::Config::parse(&text).unwrap()).unwrap()
}

fn scrape(addr: SocketAddr) -> String {
    let r = request(addr, &get("/metrics"));
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("text/plain; version=0.0.4"));
    r.text()
}

/// Sum of `name` over samples whose labels include every pair of `want`.
fn sum(samples: &[Sample], name: &str, want: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .filter(|s| s.name == name)
        .filter(|s| {
            want.iter()
                .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|s| s.value)
        .sum()
}

/// Every sample's family has one HELP and one TYPE; histogram families have cumulative
/// buckets ending in `+Inf` equal to `_count`. Returns the parsed samples.
fn check_exposition(text: &str) -> Vec<Sample> {
    let (samples, meta) = parse(text);
    let family = |name: &str| -> String {
        for suffix in ["_bucket", "_sum", "_count"] {
            if let Some(base) = name.strip_suffix(suffix) {
                if meta.get(base).and_then(|m| m.1.as_deref()) == Some("histogram") {
                    return base.to_string();
                }
            }
        }
        name.to_string()
    };
    for s in &samples {
        let f = family(&s.name);
        let m = meta.get(&f);
        assert!(m.is_some_and(|m| m.0), "no HELP for {f}");
        assert!(m.is_some_and(|m| m.1.is_some()), "no TYPE for {f}");
    }
    // histograms: group buckets by labels without `le`
    let mut groups = Buckets::new();
    for s in samples.iter().filter(|s| s.name.ends_with("_bucket")) {
        let mut l = s.labels.clone();
        let le = l.remove("le").expect("bucket without le");
        let le = if le == "+Inf" {
            f64::INFINITY
        } else {
            le.parse().unwrap()
        };
        groups
            .entry((family(&s.name), l))
            .or_default()
            .push((le, s.value));
    }
    for ((fam, labels), buckets) in &groups {
        assert!(
            buckets
                .windows(2)
                .all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1),
            "{fam}{labels:?}: buckets not cumulative: {buckets:?}"
        );
        let last = buckets.last().unwrap();
        assert_eq!(last.0, f64::INFINITY, "{fam}{labels:?}: no +Inf bucket");
        let count = samples
            .iter()
            .find(|s| s.name == format!("{fam}_count") && &s.labels == labels)
            .unwrap_or_else(|| panic!("{fam}{labels:?}: no _count"));
        assert_eq!(count.value, last.1, "{fam}{labels:?}: +Inf != _count");
        assert!(
            samples
                .iter()
                .any(|s| s.name == format!("{fam}_sum") && &s.labels == labels),
            "{fam}{labels:?}: no _sum"
        );
    }
    samples
}

/// `promtool check metrics` on `text`: `Some(report)` on failure, `None` when it passed or
/// promtool is not installed (said once on stderr).
fn promtool(text: &str) -> Option<String> {
    let child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            assert!(
                std::env::var_os("RINGGATE_REQUIRE_PROMTOOL").is_none(),
                "promtool is not installed but RINGGATE_REQUIRE_PROMTOOL is set (.ci/run)"
            );
            eprintln!(
                "SKIPPED promtool check: promtool is not installed \
                 (apt-get install prometheus; .ci/run installs it)"
            );
            return None;
        }
        Err(e) => panic!("promtool: {e}"),
    };
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    if out.status.success() {
        None
    } else {
        Some(format!(
            "promtool exit {:?}:\n{}{}",
            out.status.code(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

const CHAT: &str = r#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}"#;
const CHAT_STREAM: &str =
    r#"{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
const RESPONSES: &str = r#"{"model":"gpt-4o-mini","input":"hi"}"#;
const MESSAGES: &str =
    r#"{"model":"alias","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}"#;
const EMBED: &str = r#"{"model":"gpt-4o-mini","input":"hi"}"#;
const UNKNOWN: &str = r#"{"model":"nope","messages":[{"role":"user","content":"hi"}]}"#;

/// Regression: Responses were counted as `models` and Messages as `health`.
#[test]
fn requests_are_counted_under_their_endpoint_model_and_provider() {
    for driver in variants() {
        let stack = Stack::new(Profile::Instant, driver, "");
        let addr = stack.addr;
        let send = |raw: Vec<u8>, n: usize, want: u16| {
            for _ in 0..n {
                let r = request(addr, &raw);
                assert_eq!(r.status, want, "{}", r.text());
            }
        };
        send(post("/v1/chat/completions", CHAT), 3, 200);
        send(post("/v1/chat/completions", CHAT_STREAM), 2, 200);
        send(post("/v1/responses", RESPONSES), 2, 200);
        send(post("/v1/messages", MESSAGES), 4, 200);
        send(post("/v1/embeddings", EMBED), 1, 200);
        send(get("/v1/models"), 2, 200);
        send(get("/healthz"), 1, 200);
        send(get("/readyz"), 1, 200);
        send(get("/nowhere"), 1, 404);
        send(post("/v1/chat/completions", UNKNOWN), 1, 404);

        // At two shards a scrape has the other shard's numbers as it last published them (once
        // a second): scrape until the 18 requests are counted. Each earlier scrape is a
        // `metrics` request (counted once answered): `scrapes` of them at most.
        let t0 = Instant::now();
        let mut scrapes = 0.0;
        let but_metrics =
            |s: &[Sample], fam: &str| sum(s, fam, &[]) - sum(s, fam, &[("endpoint", "metrics")]);
        let (text, s) = loop {
            let text = scrape(addr);
            let s = check_exposition(&text);
            if but_metrics(&s, "ringgate_requests_total") == 18.0
                && but_metrics(&s, "ringgate_request_duration_seconds_count") == 18.0
                && but_metrics(&s, "ringgate_gateway_overhead_seconds_count") == 18.0
                && sum(&s, "ringgate_time_to_first_token_seconds_count", &[]) == 2.0
                && sum(&s, "ringgate_upstream_duration_seconds_count", &[]) == 12.0
            {
                break (text, s);
            }
            assert!(t0.elapsed() < Duration::from_secs(10), "{driver}\n{text}");
            scrapes += 1.0;
            std::thread::sleep(Duration::from_millis(50));
        };
        if let Some(report) = promtool(&text) {
            panic!("{driver}: {report}\n{text}");
        }
        let req = |ep: &str, model: &str, provider: &str, class: &str| {
            sum(
                &s,
                "ringgate_requests_total",
                &[
                    ("endpoint", ep),
                    ("model", model),
                    ("provider", provider),
                    ("status_class", class),
                ],
            )
        };
        assert_eq!(
            req("chat_completions", "gpt-4o-mini", "local", "2xx"),
            5.0,
            "{driver}\n{text}"
        );
        assert_eq!(
            req("responses", "gpt-4o-mini", "local", "2xx"),
            2.0,
            "{driver}\n{text}"
        );
        assert_eq!(
            req("messages", "alias", "local", "2xx"),
            4.0,
            "{driver}\n{text}"
        );
        assert_eq!(
            req("embeddings", "gpt-4o-mini", "local", "2xx"),
            1.0,
            "{driver}\n{text}"
        );
        assert_eq!(req("models", "", "", "2xx"), 2.0, "{driver}\n{text}");
        assert_eq!(req("health", "", "", "2xx"), 2.0, "{driver}\n{text}");
        assert_eq!(req("other", "", "", "4xx"), 1.0, "{driver}\n{text}");
        assert_eq!(
            req("chat_completions", "", "", "4xx"),
            1.0,
            "{driver}\n{text}"
        );
        // nothing else, and the scrape does not count itself before it is answered
        let metrics = sum(&s, "ringgate_requests_total", &[("endpoint", "metrics")]);
        assert!(
            metrics <= scrapes,
            "{driver}: {metrics} of {scrapes}\n{text}"
        );
        assert_eq!(
            sum(&s, "ringgate_requests_total", &[]),
            18.0 + metrics,
            "{driver}\n{text}"
        );

        // histograms: one observation per request
        let count = |fam: &str, want: &[(&str, &str)]| sum(&s, &format!("{fam}_count"), want);
        let dur = "ringgate_request_duration_seconds";
        let ovh = "ringgate_gateway_overhead_seconds";
        for (ep, n) in [
            ("chat_completions", 6.0),
            ("responses", 2.0),
            ("messages", 4.0),
            ("embeddings", 1.0),
            ("models", 2.0),
            ("health", 2.0),
            ("other", 1.0),
        ] {
            assert_eq!(count(dur, &[("endpoint", ep)]), n, "{driver} {ep}\n{text}");
            assert_eq!(count(ovh, &[("endpoint", ep)]), n, "{driver} {ep}\n{text}");
        }
        assert_eq!(count(dur, &[]), 18.0 + metrics);
        // time to first token: the two streams only
        let ttft = "ringgate_time_to_first_token_seconds";
        assert_eq!(count(ttft, &[]), 2.0, "{driver}\n{text}");
        assert_eq!(
            count(
                ttft,
                &[("endpoint", "chat_completions"), ("model", "gpt-4o-mini")]
            ),
            2.0
        );
        // upstream: every request that reached the upstream
        let up = "ringgate_upstream_duration_seconds";
        assert_eq!(
            count(up, &[("model", "gpt-4o-mini"), ("provider", "local")]),
            8.0
        );
        assert_eq!(count(up, &[("model", "alias"), ("provider", "local")]), 4.0);
        // the overhead is a part of the total; the upstream wait too
        let total = sum(&s, &format!("{dur}_sum"), &[]);
        assert!(sum(&s, &format!("{ovh}_sum"), &[]) <= total);
        assert!(sum(&s, &format!("{up}_sum"), &[]) <= total);
        assert!(sum(&s, &format!("{up}_sum"), &[]) > 0.0);

        // process-wide families
        assert_eq!(
            s.iter()
                .filter(|x| x.name == "ringgate_config_info")
                .map(|x| (x.labels["hash"].len(), x.value))
                .collect::<Vec<_>>(),
            vec![(16, 1.0)]
        );
        assert_eq!(
            sum(&s, "ringgate_config_reloads_total", &[("result", "error")]),
            0.0
        );

        // the next scrape counts the first one (at two shards: once published)
        let t0 = Instant::now();
        loop {
            let s2 = check_exposition(&scrape(addr));
            let metrics = sum(&s2, "ringgate_requests_total", &[("endpoint", "metrics")]);
            if metrics == scrapes + 1.0 {
                break;
            }
            assert!(metrics <= scrapes + 1.0, "{driver}: {metrics}");
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "{driver}: {metrics}"
            );
            scrapes += 1.0;
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Scrapes taken while load runs on two shards pass promtool; once the load stopped and the
/// shards published, the merged counts equal the requests sent.
#[test]
fn promtool_passes_on_scrapes_under_load_and_shards_merge() {
    let mock = start_mock(Profile::Instant, "epoll");
    let gw = two_shards(mock.addr);
    let addr = gw.addr;
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let streams = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..4)
        .map(|w| {
            let (stop, sent, streams) = (stop.clone(), sent.clone(), streams.clone());
            std::thread::spawn(move || {
                let bodies = [
                    ("/v1/chat/completions", CHAT),
                    ("/v1/chat/completions", CHAT_STREAM),
                    ("/v1/responses", RESPONSES),
                    ("/v1/messages", MESSAGES),
                ];
                let mut i = w;
                while !stop.load(Ordering::Relaxed) {
                    let (path, body) = bodies[i % bodies.len()];
                    i += 1;
                    // a fresh connection each time: SO_REUSEPORT spreads them over both shards
                    let r = request(addr, &post(path, body));
                    assert_eq!(r.status, 200, "{}", r.text());
                    sent.fetch_add(1, Ordering::Relaxed);
                    if body == CHAT_STREAM {
                        streams.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut scrapes = 0;
    while Instant::now() < deadline {
        let text = scrape(addr);
        check_exposition(&text);
        if let Some(report) = promtool(&text) {
            stop.store(true, Ordering::Relaxed);
            panic!("{report}\n{text}");
        }
        scrapes += 1;
        std::thread::sleep(Duration::from_millis(200));
    }
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().unwrap();
    }
    assert!(scrapes >= 3);
    let sent = sent.load(Ordering::Relaxed) as f64;
    let streams = streams.load(Ordering::Relaxed) as f64;
    assert!(sent > 20.0, "only {sent} requests");
    // The other shard's snapshot is at most a second old: poll until it caught up.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let s = check_exposition(&scrape(addr));
        let api = |name: &str| {
            ["chat_completions", "responses", "messages"]
                .iter()
                .map(|ep| sum(&s, name, &[("endpoint", ep)]))
                .sum::<f64>()
        };
        let requests = api("ringgate_requests_total");
        let counted = api("ringgate_request_duration_seconds_count");
        let ttft = sum(&s, "ringgate_time_to_first_token_seconds_count", &[]);
        let shards = s
            .iter()
            .filter(|x| x.name == "ringgate_connections_total" && x.value > 0.0)
            .count();
        if requests == sent && counted == sent && ttft == streams {
            assert_eq!(shards, 2, "both shards served (SO_REUSEPORT)");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "requests {requests}, histogram count {counted}, ttft {ttft}; sent {sent} ({streams} streams)"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    gw.stop();
}
