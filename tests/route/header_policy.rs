//! The header policy (`upstream::headers`, README "Headers"), end to end: a capturing fake
//! upstream records every header line each provider kind receives — each forwarded header
//! arrives where the table says and nowhere else, each dropped one (hop-by-hop, cookies, the
//! client's credentials) never — and the client sees the upstream's rate-limit / request-id /
//! retry-after lines, renamed to its dialect's names when the dialects differ. Both drivers.

#[path = "../common/mod.rs"]
mod common;

use common::capture::{Capture, Seen};
use common::*;
use ringgate::config::Config;
use ringgate::server::{self, Running};

const KEY_ENV: &str = "RINGGATE_HEADER_POLICY_KEY";
const PROVIDER_KEY: &str = "sk-provider-hp";

/// Response lines an OpenAI-style upstream sends (plus ones that must not come back).
const OPENAI_LINES: &str = "x-request-id: xr-up\r\nx-ratelimit-limit-requests: 60\r\n\
x-ratelimit-remaining-tokens: 990\r\nx-ratelimit-reset-requests: 1s\r\nopenai-processing-ms: 5\r\n\
retry-after: 7\r\nset-cookie: up=1\r\nserver: upstream/1\r\n";
/// Response lines an Anthropic upstream sends.
const ANTHROPIC_LINES: &str = "request-id: req-up\r\nanthropic-ratelimit-requests-limit: 50\r\n\
anthropic-ratelimit-tokens-remaining: 880\r\nanthropic-ratelimit-requests-reset: 2026-01-01T00:00:00Z\r\n\
anthropic-ratelimit-input-tokens-limit: 40\r\nretry-after: 7\r\nset-cookie: up=1\r\n";

/// Forwardable client headers, and ones that must never travel.
const CLIENT_HEADERS: &str = "anthropic-version: 2024-10-22\r\nanthropic-beta: tools-1\r\n\
anthropic-beta: cache-2\r\nOpenAI-Organization: org-c\r\nOpenAI-Project: proj-c\r\n\
Idempotency-Key: idem-c\r\nX-Request-Id: req-c\r\nCookie: session=c\r\nAuthorization: Bearer client-tok\r\n\
x-api-key: client-tok\r\napi-key: client-tok\r\nx-goog-api-key: client-tok\r\n\
Proxy-Authorization: Basic Y2xpZW50\r\nTE: trailers\r\nConnection: keep-alive\r\nKeep-Alive: timeout=5\r\n\
User-Agent: sdk/1\r\nX-Stainless-Lang: python\r\nOrigin-Trace: c\r\n";

const KINDS: [&str; 5] = [
    "openai",
    "openai-compatible",
    "azure",
    "anthropic",
    "gemini",
];

fn gateway(oa: &Capture, an: &Capture, v: Variant) -> Running {
    let Variant { driver, shards } = v;
    std::env::set_var(KEY_ENV, PROVIDER_KEY);
    let mut text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nshards = {shards}\npin = false\ndriver = \"{driver}\"\n"
    );
    for kind in KINDS {
        let up = if kind == "anthropic" {
            an.addr
        } else {
            oa.addr
        };
        text.push_str(&format!(
            "[[provider]]\nname = \"{kind}\"\nkind = \"{kind}\"\nbase_url = \"http://{up}/b\"\n\
             api_key_env = \"{KEY_ENV}\"\n[[model]]\nname = \"m-{kind}\"\nprovider = \"{kind}\"\n"
        ));
    }
    server::start(Config::parse(&text).unwrap()).unwrap()
}

fn post_with(path: &str, body: &str, headers: &str) -> Vec<u8> {
    format!(
        "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n{headers}Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// What a provider of `kind` must receive besides host / content-type / content-length.
fn expected_lines(kind: &str) -> Vec<String> {
    let mut want: Vec<String> = match kind {
        "anthropic" => vec![
            "anthropic-version: 2024-10-22".into(),
            "anthropic-beta: tools-1, cache-2".into(),
        ],
        "openai" => vec![
            "openai-organization: org-c".into(),
            "openai-project: proj-c".into(),
            "idempotency-key: idem-c".into(),
        ],
        _ => vec![],
    };
    want.push("x-request-id: req-c".into());
    want.push(match kind {
        "anthropic" => format!("x-api-key: {PROVIDER_KEY}"),
        "azure" => format!("api-key: {PROVIDER_KEY}"),
        "gemini" => format!("x-goog-api-key: {PROVIDER_KEY}"),
        _ => format!("authorization: Bearer {PROVIDER_KEY}"),
    });
    want
}

fn got_lines(seen: &Seen) -> Vec<String> {
    seen.headers
        .iter()
        .filter(|(n, _)| {
            !["host", "content-type", "content-length"].contains(&n.to_ascii_lowercase().as_str())
        })
        .map(|(n, v)| format!("{n}: {v}"))
        .collect()
}

fn chat_body(stream: bool) -> String {
    format!(
        r#"{{"model":"MODEL","max_tokens":5,"stream":{stream},"messages":[{{"role":"user","content":"hi"}}]}}"#
    )
}

#[test]
fn each_client_header_reaches_exactly_the_kinds_the_table_names() {
    for d in variants() {
        let (oa, an) = (
            Capture::start(OPENAI_LINES),
            Capture::start(ANTHROPIC_LINES),
        );
        let gw = gateway(&oa, &an, d);
        let (mut n_oa, mut n_an) = (0, 0);
        // every kind through the Chat dialect (passthrough or translated), then the Messages and
        // Gemini dialects: the policy depends on the provider kind only
        let mut cases: Vec<(&str, String, String)> = KINDS
            .iter()
            .map(|k| {
                let body = chat_body(false).replace("MODEL", &format!("m-{k}"));
                (*k, "/v1/chat/completions".to_string(), body)
            })
            .collect();
        for k in KINDS {
            let body = chat_body(true).replace("MODEL", &format!("m-{k}"));
            cases.push((k, "/v1/messages".into(), body));
            let gem = r#"{"contents":[{"role":"user","parts":[{"text":"hi"}]}]}"#;
            cases.push((
                k,
                format!("/v1beta/models/m-{k}:generateContent"),
                gem.into(),
            ));
        }
        for (kind, path, body) in cases {
            let what = format!("{d} {kind} {path}");
            let r = request(gw.addr, &post_with(&path, &body, CLIENT_HEADERS));
            assert_eq!(r.status, 200, "{what}: {}", r.text());
            let seen = if kind == "anthropic" {
                n_an += 1;
                an.nth(n_an - 1)
            } else {
                n_oa += 1;
                oa.nth(n_oa - 1)
            };
            assert_eq!(got_lines(&seen), expected_lines(kind), "{what}");
            let all = format!("{:?}", seen.headers).to_ascii_lowercase();
            for never in [
                "client-tok",
                "session=c",
                "y2xpzw50",
                "trailers",
                "timeout=5",
                "sdk/1",
            ] {
                assert!(
                    !all.contains(never),
                    "{what}: {never} reached the upstream: {all}"
                );
            }
        }
        gw.stop();
    }
}

#[test]
fn without_client_headers_the_provider_lines_go_alone() {
    for d in variants() {
        let (oa, an) = (Capture::start(""), Capture::start(""));
        let gw = gateway(&oa, &an, d);
        let body = chat_body(false).replace("MODEL", "m-anthropic");
        let r = request(gw.addr, &post("/v1/chat/completions", &body));
        assert_eq!(r.status, 200, "{d}: {}", r.text());
        assert_eq!(
            got_lines(&an.nth(0)),
            [
                "anthropic-version: 2023-06-01".to_string(),
                format!("x-api-key: {PROVIDER_KEY}")
            ],
            "{d}: the default version"
        );
        gw.stop();
    }
}

#[test]
fn unforwardable_values_are_a_400_in_the_client_dialect() {
    for d in variants() {
        let (oa, an) = (Capture::start(""), Capture::start(""));
        let gw = gateway(&oa, &an, d);
        for (path, body, h) in [
            (
                "/v1/chat/completions",
                chat_body(false).replace("MODEL", "m-openai"),
                "OpenAI-Project: caf\u{e9}\r\n",
            ),
            (
                "/v1/messages",
                chat_body(false).replace("MODEL", "m-anthropic"),
                "anthropic-version: a\r\nAnthropic-Version: b\r\n",
            ),
        ] {
            let r = request(gw.addr, &post_with(path, &body, h));
            assert_eq!(r.status, 400, "{d} {path}: {}", r.text());
            let v = r.json();
            let msg = if path == "/v1/messages" {
                assert_eq!(v["type"], "error");
                v["error"]["message"].as_str().unwrap().to_string()
            } else {
                v["error"]["message"].as_str().unwrap().to_string()
            };
            assert!(
                msg.contains("openai-project") || msg.contains("anthropic-version"),
                "{msg}"
            );
        }
        assert_eq!(oa.count() + an.count(), 0);
        gw.stop();
    }
}

/// The client's view of the upstream's response lines (lower-cased names).
fn client_lines(r: &Response) -> Vec<String> {
    let keep = [
        "x-ratelimit-",
        "anthropic-ratelimit-",
        "request-id",
        "x-request-id",
        "x-upstream-request-id",
        "retry-after",
        "openai-",
        "set-cookie",
        "server",
    ];
    r.headers
        .iter()
        .map(|(n, v)| (n.to_ascii_lowercase(), v))
        .filter(|(n, _)| keep.iter().any(|k| n.starts_with(k)))
        .map(|(n, v)| format!("{n}: {v}"))
        .collect()
}

#[test]
fn response_headers_come_back_in_the_clients_names() {
    // (`x-request-id` is the request's id: the client's own, echoed; the upstream's comes back as
    // `x-upstream-request-id`, or Anthropic's `request-id`)
    let openai_names = [
        "x-upstream-request-id: xr-up",
        "x-ratelimit-limit-requests: 60",
        "x-ratelimit-remaining-tokens: 990",
        "x-ratelimit-reset-requests: 1s",
        "openai-processing-ms: 5",
        "retry-after: 7",
    ];
    let from_openai_to_anthropic = [
        "request-id: xr-up",
        "anthropic-ratelimit-requests-limit: 60",
        "anthropic-ratelimit-tokens-remaining: 990",
        "retry-after: 7",
    ];
    let from_openai_to_gemini = [
        "x-upstream-request-id: xr-up",
        "x-ratelimit-limit-requests: 60",
        "x-ratelimit-remaining-tokens: 990",
        "x-ratelimit-reset-requests: 1s",
        "retry-after: 7",
    ];
    let anthropic_names = [
        "request-id: req-up",
        "anthropic-ratelimit-requests-limit: 50",
        "anthropic-ratelimit-tokens-remaining: 880",
        "anthropic-ratelimit-requests-reset: 2026-01-01T00:00:00Z",
        "anthropic-ratelimit-input-tokens-limit: 40",
        "retry-after: 7",
    ];
    let from_anthropic = [
        "x-upstream-request-id: req-up",
        "x-ratelimit-limit-requests: 50",
        "x-ratelimit-remaining-tokens: 880",
        "retry-after: 7",
    ];
    let gem = r#"{"contents":[{"role":"user","parts":[{"text":"hi"}]}]}"#;
    for d in variants() {
        let (oa, an) = (
            Capture::start(OPENAI_LINES),
            Capture::start(ANTHROPIC_LINES),
        );
        let gw = gateway(&oa, &an, d);
        for stream in [false, true] {
            let chat = |m: &str| chat_body(stream).replace("MODEL", m);
            let gem_path = |m: &str| {
                if stream {
                    format!("/v1beta/models/{m}:streamGenerateContent?alt=sse")
                } else {
                    format!("/v1beta/models/{m}:generateContent")
                }
            };
            let cases: [(&str, String, String, &[&str]); 6] = [
                (
                    "chat → openai (same)",
                    "/v1/chat/completions".into(),
                    chat("m-openai"),
                    &openai_names,
                ),
                (
                    "messages → openai",
                    "/v1/messages".into(),
                    chat("m-openai"),
                    &from_openai_to_anthropic,
                ),
                (
                    "gemini → openai",
                    gem_path("m-openai"),
                    gem.into(),
                    &from_openai_to_gemini,
                ),
                (
                    "messages → anthropic (same)",
                    "/v1/messages".into(),
                    chat("m-anthropic"),
                    &anthropic_names,
                ),
                (
                    "chat → anthropic",
                    "/v1/chat/completions".into(),
                    chat("m-anthropic"),
                    &from_anthropic,
                ),
                (
                    "gemini → anthropic",
                    gem_path("m-anthropic"),
                    gem.into(),
                    &from_anthropic,
                ),
            ];
            for (what, path, body, want) in cases {
                let r = request(gw.addr, &post_with(&path, &body, "x-request-id: cli-1\r\n"));
                assert_eq!(r.status, 200, "{d} {what} stream={stream}: {}", r.text());
                let mut want: Vec<String> = want.iter().map(|l| l.to_string()).collect();
                want.push("x-request-id: cli-1".into());
                want.sort();
                let mut got = client_lines(&r);
                got.sort();
                assert_eq!(got, want, "{d} {what} stream={stream}");
            }
        }
        gw.stop();
    }
}
