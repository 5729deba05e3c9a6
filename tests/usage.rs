//! Usage, spend and budgets end to end: real sockets on 127.0.0.1 port 0, the project's mock
//! (standalone, in-process) or a raw fake upstream; the ledger (`Running::spend`) and
//! `/metrics` must hold exactly the tokens the upstream reported, priced per model.

mod common;

use common::*;
use ringgate::governance::keyring::Digest;
use ringgate::governance::spend::UsageRow;
use ringgate::mock::Profile;

const SECRET: &str = "rg-test-usage-5e4d3c2b1a09f8e7d6c5b4a3";

fn hex(secret: &str) -> String {
    Digest::of(secret.as_bytes())
        .0
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn post_key(path: &str, body: &str) -> Vec<u8> {
    format!(
        "POST {path} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {SECRET}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// The gateway config: the standalone mock as an OpenAI provider (`gpt-4o-mini`, $1/$2 per
/// 1M tokens) and one key with `key_extra`.
fn config(key_extra: &str) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
shards = 1
pin = false

[[provider]]
name = "oa"
kind = "openai"
base_url = "http://{{mock}}/v1"

[[model]]
name = "gpt-4o-mini"
provider = "oa"
price_input_per_mtok = 1.0
price_output_per_mtok = 2.0

[[key]]
name = "team-a"
key_sha256 = "{}"
{key_extra}
"#,
        hex(SECRET)
    )
}

/// The ledger once it holds `requests` requests in all (a request is recorded when it ends,
/// just after its last byte went out: poll).
fn rows_after(st: &Stack, requests: u64) -> Vec<UsageRow> {
    let mut rows = Vec::new();
    for _ in 0..200 {
        rows = st.gateway().spend.snapshot();
        if rows.iter().map(|r| r.requests).sum::<u64>() == requests {
            return rows;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    panic!("want {requests} requests in the ledger: {rows:?}");
}

#[test]
fn non_stream_usage_is_recorded_exactly_and_priced() {
    let mock = start_mock(Profile::Instant, "epoll");
    let st = Stack::with_config(mock, &config(""));
    let body = r#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hello there"}],"max_tokens":7}"#;
    let r = request(st.addr, &post_key("/v1/chat/completions", body));
    assert_eq!(r.status, 200, "{}", r.text());
    let u = r.json()["usage"].clone();
    let (i, o) = (
        u["prompt_tokens"].as_u64().unwrap(),
        u["completion_tokens"].as_u64().unwrap(),
    );
    assert_eq!(o, 7);
    let rows = rows_after(&st, 1);
    assert_eq!(rows.len(), 1, "{rows:?}");
    let row = &rows[0];
    assert_eq!(
        (row.key.as_str(), row.model.as_str()),
        ("team-a", "gpt-4o-mini")
    );
    assert_eq!(
        (row.requests, row.input_tokens, row.output_tokens),
        (1, i, o)
    );
    assert_eq!(row.spend_nanos, i * 1000 + o * 2000);
    assert_eq!(row.period_start, 0, "no budget_period: total");
    assert_eq!(metric(st.addr, "ringgate_key_input_tokens_total{"), i);
    assert_eq!(metric(st.addr, "ringgate_key_output_tokens_total{"), o);
}
