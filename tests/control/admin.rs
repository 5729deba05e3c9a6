//! The admin listener and the key admin API end to end, on the real binary: main and admin
//! listeners on 127.0.0.1 port 0 (the addresses are read from the start-up log), the in-process
//! mock provider, a temp `state_dir` per test.

#[path = "../common/mod.rs"]
mod common;

#[path = "admin/keys.rs"]
mod keys;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_ringgate");
const TOKEN: &str = "admin-test-token-6f0c1d2e3a4b5c6d7e8f";

/// A temp dir removed on drop.
struct Dir(PathBuf);

impl Dir {
    fn new(tag: &str) -> Dir {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let p = std::env::temp_dir().join(format!("rg-admin-{tag}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&p).unwrap();
        Dir(p)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A gateway config: `shards`, `server` lines, the mock provider (profile `profile`), `[admin]`
/// on port 0 unless `admin` says otherwise.
fn config(state: &Path, shards: usize, server: &str, admin: &str, profile: &str) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
shards = {shards}
pin = false
state_dir = "{}/state"
{server}

{admin}

[[provider]]
name = "mock"
kind = "mock"
profile = "{profile}"

[[model]]
name = "gpt-4o-mini"
provider = "mock"
price_input_per_mtok = 1000.0
price_output_per_mtok = 2000.0

[[model]]
name = "other-model"
provider = "mock"
"#,
        state.display()
    )
}

const ADMIN: &str = "[admin]\nlisten = \"127.0.0.1:0\"\n";

/// A `ringgate` child process; killed on drop.
struct Gw {
    child: Child,
    main: SocketAddr,
    admin: Option<SocketAddr>,
    log: Receiver<String>,
}

impl Gw {
    fn start(dir: &Dir, cfg: &str, token: Option<&str>) -> Gw {
        Gw::try_start(dir, cfg, token).unwrap_or_else(|e| panic!("did not start: {e}"))
    }

    fn try_start(dir: &Dir, cfg: &str, token: Option<&str>) -> Result<Gw, String> {
        let path = dir.0.join("ringgate.toml");
        std::fs::write(&path, cfg).unwrap();
        let mut cmd = Command::new(BIN);
        cmd.arg("--config")
            .arg(&path)
            .env_remove("OPENAI_API_KEY")
            .env_remove("RINGGATE_ADMIN_TOKEN")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if let Some(t) = token {
            cmd.env("RINGGATE_ADMIN_TOKEN", t);
        }
        let mut child = cmd.spawn().unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let addr_in = |line: &str, what: &str| -> Option<SocketAddr> {
            let rest = line.split(what).nth(1)?;
            rest.split_whitespace().next()?.parse().ok()
        };
        let mut main = None;
        let mut seen = String::new();
        let until = Instant::now() + Duration::from_secs(20);
        while let Some(left) = until.checked_duration_since(Instant::now()) {
            let Ok(line) = rx.recv_timeout(left) else {
                break;
            };
            seen.push_str(&line);
            seen.push('\n');
            if line.contains("admin listening on http://") {
                return Ok(Gw {
                    child,
                    main: main.unwrap(),
                    admin: addr_in(&line, "admin listening on http://"),
                    log: rx,
                });
            }
            if let Some(a) = addr_in(&line, " listening on http://") {
                main = Some(a);
                if !cfg.contains("[admin]") {
                    return Ok(Gw {
                        child,
                        main: a,
                        admin: None,
                        log: rx,
                    });
                }
            }
        }
        let status = child.wait().unwrap();
        Err(format!("exit {:?}\n{seen}", status.code()))
    }

    fn admin(&self) -> SocketAddr {
        self.admin.unwrap()
    }

    /// SIGTERM, then wait for the exit code.
    fn terminate(mut self) -> Option<i32> {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let until = Instant::now() + Duration::from_secs(10);
        while Instant::now() < until {
            if let Ok(Some(s)) = self.child.try_wait() {
                return s.code();
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    }
}

impl Drop for Gw {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An admin request (`token`: the bearer token to send).
fn admin_req(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &str,
) -> Response {
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    let raw = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    request(addr, raw.as_bytes())
}

fn create(gw: &Gw, body: &str) -> (Value, String) {
    let r = admin_req(gw.admin(), "POST", "/admin/keys", Some(TOKEN), body);
    assert_eq!(r.status, 201, "{}", r.text());
    let v = r.json();
    let secret = v["key"].as_str().unwrap().to_string();
    (v, secret)
}

const CHAT: &str =
    r#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}],"max_tokens":3}"#;

fn chat_raw(key: &str, body: &str) -> Vec<u8> {
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {key}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

fn chat(addr: SocketAddr, key: &str) -> u16 {
    request(addr, &chat_raw(key, CHAT)).status
}

#[test]
fn every_admin_request_needs_the_token_and_errors_are_json() {
    common::shard_counts().for_each(every_admin_request_needs_the_token_and_errors_are_json_at);
}

fn every_admin_request_needs_the_token_and_errors_are_json_at(shards: usize) {
    let dir = Dir::new("token");
    let gw = Gw::start(
        &dir,
        &config(&dir.0, shards, "", ADMIN, "instant"),
        Some(TOKEN),
    );
    let a = gw.admin();
    for token in [None, Some("wrong"), Some(&TOKEN[..TOKEN.len() - 1])] {
        for (m, p) in [
            ("GET", "/admin/keys"),
            ("POST", "/admin/drain"),
            ("GET", "/metrics"),
        ] {
            let r = admin_req(a, m, p, token, "");
            assert_eq!(r.status, 401, "{m} {p} {token:?}: {}", r.text());
            assert_eq!(r.json()["error"]["type"], "invalid_request_error");
        }
    }
    let r = admin_req(a, "GET", "/admin/keys", Some(TOKEN), "");
    assert_eq!(
        (r.status, r.json()["keys"].as_array().unwrap().len()),
        (200, 0)
    );
    let r = admin_req(a, "GET", "/metrics", Some(TOKEN), "");
    assert_eq!(r.status, 200);
    assert!(r.header("content-type").unwrap().starts_with("text/plain"));
    // health needs no token; unknown paths, bad bodies, big bodies: JSON errors
    assert_eq!(admin_req(a, "GET", "/healthz", None, "").status, 200);
    let r = admin_req(a, "GET", "/admin/nope", Some(TOKEN), "");
    assert_eq!(
        (r.status, r.json()["error"]["code"].as_str()),
        (404, Some("not_found"))
    );
    let r = admin_req(a, "POST", "/admin/keys", Some(TOKEN), "{not json");
    assert_eq!(
        (r.status, r.json()["error"]["code"].as_str()),
        (400, Some("invalid_body"))
    );
    let r = admin_req(a, "PUT", "/admin/keys", Some(TOKEN), "{}");
    assert_eq!(r.status, 405);
    let big = format!("{{\"name\":\"x\",\"models\":[\"{}\"]}}", "a".repeat(70_000));
    let r = admin_req(a, "POST", "/admin/keys", Some(TOKEN), &big);
    assert_eq!(r.status, 413, "{}", r.text());
    for bad in [
        r#"{"name":"a b"}"#,
        r#"{"rpm":5}"#,
        r#"{"name":"a","rpm":0}"#,
        r#"{"name":"a","secret":"x"}"#,
    ] {
        let r = admin_req(a, "POST", "/admin/keys", Some(TOKEN), bad);
        assert_eq!(r.status, 400, "{bad}: {}", r.text());
    }
}

#[test]
fn without_a_token_on_loopback_the_admin_api_is_401_and_metrics_are_served() {
    common::shard_counts()
        .for_each(without_a_token_on_loopback_the_admin_api_is_401_and_metrics_are_served_at);
}

fn without_a_token_on_loopback_the_admin_api_is_401_and_metrics_are_served_at(shards: usize) {
    let dir = Dir::new("notoken");
    let gw = Gw::start(&dir, &config(&dir.0, shards, "", ADMIN, "instant"), None);
    let r = admin_req(gw.admin(), "GET", "/admin/keys", Some("anything"), "");
    assert_eq!(r.status, 401);
    assert!(r.text().contains("RINGGATE_ADMIN_TOKEN"), "{}", r.text());
    assert_eq!(
        admin_req(gw.admin(), "GET", "/metrics", None, "").status,
        200
    );
}

#[test]
fn a_non_loopback_admin_address_without_a_token_refuses_to_start() {
    common::shard_counts()
        .for_each(a_non_loopback_admin_address_without_a_token_refuses_to_start_at);
}

fn a_non_loopback_admin_address_without_a_token_refuses_to_start_at(shards: usize) {
    let dir = Dir::new("exposed");
    let admin = "[admin]\nlisten = \"0.0.0.0:0\"\n";
    let err = Gw::try_start(&dir, &config(&dir.0, shards, "", admin, "instant"), None)
        .err()
        .unwrap();
    assert!(err.starts_with("exit Some(1)"), "{err}");
    assert!(
        err.contains("refusing to serve the admin API on 0.0.0.0:0 without a token")
            && err.contains("RINGGATE_ADMIN_TOKEN"),
        "{err}"
    );
    // with a token it starts
    let gw = Gw::start(
        &dir,
        &config(&dir.0, shards, "", admin, "instant"),
        Some(TOKEN),
    );
    let a = SocketAddr::from(([127, 0, 0, 1], gw.admin().port()));
    assert_eq!(
        admin_req(a, "GET", "/admin/keys", Some(TOKEN), "").status,
        200
    );
}

#[test]
fn drain_turns_readyz_503_lets_the_stream_finish_and_stops_accepting() {
    common::shard_counts()
        .for_each(drain_turns_readyz_503_lets_the_stream_finish_and_stops_accepting_at);
}

fn drain_turns_readyz_503_lets_the_stream_finish_and_stops_accepting_at(shards: usize) {
    let dir = Dir::new("drain");
    // `paced`: one delta every 20 ms, so a 40-token stream runs ~0.8 s
    let gw = Gw::start(
        &dir,
        &config(&dir.0, shards, "", ADMIN, "paced"),
        Some(TOKEN),
    );
    let body = r#"{"model":"gpt-4o-mini","stream":true,"max_tokens":40,"messages":[{"role":"user","content":"hi"}]}"#;
    let main = gw.main;
    let stream = std::thread::spawn(move || request(main, &post("/v1/chat/completions", body)));
    // wait until the stream is in flight
    let until = Instant::now() + Duration::from_secs(5);
    while metric(gw.main, "ringgate_requests_in_flight") < 2 {
        assert!(Instant::now() < until, "the stream never started");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(
        admin_req(gw.admin(), "GET", "/readyz", None, "").status,
        200
    );
    let r = admin_req(gw.admin(), "POST", "/admin/drain", Some(TOKEN), "");
    assert_eq!(
        (r.status, r.json()["status"].as_str()),
        (202, Some("draining"))
    );
    let r = admin_req(gw.admin(), "GET", "/readyz", None, "");
    assert_eq!(
        (r.status, r.json()["status"].as_str()),
        (503, Some("draining"))
    );
    // the main listener stops accepting (polled: the shard closes it on its next turn)
    let until = Instant::now() + Duration::from_secs(2);
    while TcpStream::connect(gw.main).is_ok() {
        assert!(Instant::now() < until, "the main listener still accepts");
        std::thread::sleep(Duration::from_millis(5));
    }
    // the stream in flight finished whole
    let r = stream.join().unwrap();
    assert_eq!(r.status, 200);
    let (_, _, done) = sse_content(&r.body);
    assert!(done, "the stream ended with [DONE]: {}", r.text());
    // the process stays up (admin answers) until SIGTERM
    assert_eq!(
        admin_req(gw.admin(), "GET", "/readyz", None, "").status,
        503
    );
    assert_eq!(gw.terminate(), Some(0));
}

#[test]
fn metrics_on_the_main_listener_only_on_loopback_or_when_asked() {
    common::shard_counts().for_each(metrics_on_the_main_listener_only_on_loopback_or_when_asked_at);
}

fn metrics_on_the_main_listener_only_on_loopback_or_when_asked_at(shards: usize) {
    let dir = Dir::new("metrics");
    let public = &format!(
        "[server]\nlisten = \"0.0.0.0:0\"\nauth = \"none\"\nshards = {shards}\npin = false\n"
    );
    let models = "[[provider]]\nname = \"mock\"\nkind = \"mock\"\n\n[[model]]\nname = \"m\"\nprovider = \"mock\"\n";
    let gw = Gw::start(&dir, &format!("{public}\n{models}"), None);
    let main = SocketAddr::from(([127, 0, 0, 1], gw.main.port()));
    let r = request(main, &get("/metrics"));
    assert_eq!(
        (r.status, r.json()["error"]["code"].as_str()),
        (404, Some("not_found"))
    );
    assert!(r.text().contains("admin listener"), "{}", r.text());
    assert_eq!(request(main, &get("/healthz")).status, 200);
    assert_eq!(request(main, &get("/readyz")).status, 200);
    drop(gw);
    let asked = public.replace("pin = false", "pin = false\nmetrics_on_main = true");
    let gw = Gw::start(&dir, &format!("{asked}\n{models}"), None);
    let main = SocketAddr::from(([127, 0, 0, 1], gw.main.port()));
    let r = request(main, &get("/metrics"));
    assert_eq!(r.status, 200);
    assert!(
        r.text().contains("ringgate_connections_open"),
        "{}",
        r.text()
    );
    // loopback: served (the default for the quick start)
    let gw = Gw::start(&dir, &config(&dir.0, shards, "", "", "instant"), None);
    assert_eq!(request(gw.main, &get("/metrics")).status, 200);
}

/// The stored ledger row of `key` (polled from the state file the gateway writes).
fn stored_requests(dir: &Dir, key: &str) -> u64 {
    let Ok(conn) = ringgate::governance::state::db::open(&dir.0.join("state/state.db")) else {
        return 0;
    };
    ringgate::governance::state::db::spend_rows(&conn, 0)
        .unwrap_or_default()
        .iter()
        .filter(|r| r.key == key)
        .map(|r| r.requests)
        .sum()
}

#[test]
fn usage_per_key_and_model_is_served_and_survives_a_kill() {
    let dir = Dir::new("usage");
    let cfg = config(&dir.0, 2, "", ADMIN, "instant");
    let gw = Gw::start(&dir, &cfg, Some(TOKEN));
    let (_, secret) = create(
        &gw,
        r#"{"name":"spender","budget_usd":1000,"budget_period":"month"}"#,
    );
    for _ in 0..5 {
        assert_eq!(chat(gw.main, &secret), 200);
    }
    // the ledger is written when each request ends, just after its answer went out: polled
    let until = Instant::now() + Duration::from_secs(3);
    let v = loop {
        let r = admin_req(
            gw.admin(),
            "GET",
            "/admin/keys/spender/usage",
            Some(TOKEN),
            "",
        );
        assert_eq!(r.status, 200, "{}", r.text());
        let v = r.json();
        if v["usage"][0]["requests"].as_u64() == Some(5) || Instant::now() > until {
            break v;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let rows = v["usage"].as_array().unwrap().clone();
    assert_eq!(rows.len(), 1, "{v}");
    assert_eq!(
        (rows[0]["model"].as_str(), rows[0]["requests"].as_u64()),
        (Some("gpt-4o-mini"), Some(5))
    );
    let (input, output) = (
        rows[0]["input_tokens"].as_u64().unwrap(),
        rows[0]["output_tokens"].as_u64().unwrap(),
    );
    assert!(input > 0 && output > 0, "{v}");
    let spend = rows[0]["spend_usd"].as_f64().unwrap();
    let want = (input as f64 * 1000.0 + output as f64 * 2000.0) / 1e6;
    assert!((spend - want).abs() < 1e-6, "{spend} vs {want}");
    assert_eq!(v["budget_usd"].as_f64(), Some(1000.0));
    assert!(
        (v["spent_usd"].as_f64().unwrap() - want).abs() < 1e-6,
        "{v}"
    );
    let all = admin_req(gw.admin(), "GET", "/admin/usage", Some(TOKEN), "").json();
    assert_eq!(all["usage"].as_array().unwrap().len(), 1, "{all}");
    assert_eq!(
        admin_req(
            gw.admin(),
            "GET",
            "/admin/keys/nobody/usage",
            Some(TOKEN),
            ""
        )
        .status,
        404
    );
    // flushed within a second (polled from the file), then killed without a chance to flush
    let until = Instant::now() + Duration::from_secs(3);
    while stored_requests(&dir, "spender") < 5 {
        assert!(
            Instant::now() < until,
            "the ledger was not written within 3 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(gw); // SIGKILL
    let gw = Gw::start(&dir, &cfg, Some(TOKEN));
    let v = admin_req(
        gw.admin(),
        "GET",
        "/admin/keys/spender/usage",
        Some(TOKEN),
        "",
    )
    .json();
    assert_eq!(v["usage"][0]["requests"].as_u64(), Some(5), "{v}");
    assert!(
        (v["spent_usd"].as_f64().unwrap() - want).abs() < 1e-6,
        "{v}"
    );
    // and counting goes on from there, written on a clean stop
    assert_eq!(chat(gw.main, &secret), 200);
    assert_eq!(gw.terminate(), Some(0));
    assert_eq!(stored_requests(&dir, "spender"), 6);
}
