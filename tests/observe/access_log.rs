//! The access log and request ids end to end: `[log] access = "<file>"` (in-process gateway,
//! both drivers) and `access = "stdout"` (the binary), one JSON line per request with the right
//! fields, never the key's secret nor the request body; `x-request-id` kept when the client's
//! is acceptable, replaced when not, generated when absent, on every response (errors too).

#[path = "../common/mod.rs"]
mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use ringgate::config::Config;
use ringgate::governance::keyring::Digest;
use ringgate::mock::Profile;
use ringgate::server;

const SECRET: &str = "rg-test-accesslog-7d1e5c9b3a2f4e6d8c0b1a29";
/// Sent in request bodies: must never reach the log.
const MARKER: &str = "body-marker-5a4b3c2d";

fn chat(stream: bool) -> String {
    format!(
        r#"{{"model":"gpt-4o-mini","stream":{stream},"max_tokens":4,"messages":[{{"role":"user","content":"{MARKER}"}}]}}"#
    )
}

fn post_with(path: &str, headers: &str, body: &str) -> Vec<u8> {
    format!(
        "POST {path} HTTP/1.1\r\nHost: localhost\r\n{headers}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

fn key_entry() -> String {
    let hex: String = Digest::of(SECRET.as_bytes())
        .0
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("\n[[key]]\nname = \"team-a\"\nkey_sha256 = \"{hex}\"\n")
}

fn gateway_logging_to(upstream: SocketAddr, v: Variant, access: &str) -> server::Running {
    let Variant { driver, shards } = v;
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nshards = {shards}\npin = false\ndriver = \"{driver}\"\n\
         [log]\naccess = \"{access}\"\n\
         [[provider]]\nname = \"local\"\nkind = \"openai\"\nbase_url = \"http://{upstream}/v1\"\n\
         [[model]]\nname = \"gpt-4o-mini\"\nprovider = \"local\"\n{}",
        key_entry()
    );
    server::start(Config::parse(&text).unwrap()).unwrap()
}

fn lines_of(text: &str) -> Vec<serde_json::Value> {
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

#[test]
fn file_mode_one_json_line_per_request_with_ids_and_no_secrets() {
    for driver in variants() {
        let mock = start_mock(Profile::Instant, driver);
        let dir =
            std::env::temp_dir().join(format!("rg-accesslog-{}-{driver}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("access.log");
        let _ = std::fs::remove_file(&path);
        let gw = gateway_logging_to(mock.addr, driver, path.to_str().unwrap());
        let auth = format!("Authorization: Bearer {SECRET}\r\n");
        // every request's id, in order (at two shards the shards' lines interleave in the file)
        let mut ids: Vec<String> = Vec::new();
        let mut id_of = |r: &Response| ids.push(r.header("x-request-id").unwrap().to_string());

        // 1: the client's id is kept
        let r = request(
            gw.addr,
            &post_with(
                "/v1/chat/completions",
                &format!("{auth}x-request-id: client-id_1.a:b\r\n"),
                &chat(false),
            ),
        );
        assert_eq!(r.status, 200, "{driver}: {}", r.text());
        assert_eq!(r.header("x-request-id"), Some("client-id_1.a:b"));
        id_of(&r);
        // 2: an unacceptable one is replaced
        let r = request(
            gw.addr,
            &post_with(
                "/v1/chat/completions",
                &format!("{auth}x-request-id: has space{}\r\n", "x".repeat(10)),
                &chat(true),
            ),
        );
        assert_eq!(r.status, 200, "{driver}: {}", r.text());
        let replaced = r.header("x-request-id").unwrap().to_string();
        id_of(&r);
        assert!(is_gateway_id(&replaced, driver), "{replaced}");
        let long = "y".repeat(65);
        let r = request(
            gw.addr,
            &post_with(
                "/v1/chat/completions",
                &format!("{auth}x-request-id: {long}\r\n"),
                &chat(false),
            ),
        );
        let too_long = r.header("x-request-id").unwrap().to_string();
        id_of(&r);
        assert!(is_gateway_id(&too_long, driver), "{too_long}");
        // 4: none sent: generated; ids differ
        let r = request(
            gw.addr,
            &post_with(
                "/v1/responses",
                &auth,
                r#"{"model":"gpt-4o-mini","input":"x"}"#,
            ),
        );
        assert_eq!(r.status, 200, "{driver}: {}", r.text());
        let generated = r.header("x-request-id").unwrap().to_string();
        id_of(&r);
        assert!(is_gateway_id(&generated, driver) && generated != replaced);
        // 5: errors carry one too: no key (401), unknown model (404), unknown path (404)
        let r = request(
            gw.addr,
            &post_with("/v1/chat/completions", "", &chat(false)),
        );
        assert_eq!(r.status, 401);
        let unauth_id = r.header("x-request-id").unwrap().to_string();
        id_of(&r);
        let r = request(
            gw.addr,
            &post_with(
                "/v1/chat/completions",
                &auth,
                r#"{"model":"nope","messages":[]}"#,
            ),
        );
        assert_eq!(r.status, 404);
        assert_eq!(
            r.headers
                .iter()
                .filter(|(n, _)| n == "x-request-id")
                .count(),
            1
        );
        id_of(&r);
        let r = request(gw.addr, &get("/nowhere"));
        assert_eq!(r.status, 404);
        id_of(&r);
        // 8: a head that does not parse still gets an id
        let r = request(gw.addr, b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n");
        assert_eq!(r.status, 400);
        id_of(&r);
        let sent = 8;
        let r = request(gw.addr, &get("/metrics"));
        id_of(&r);
        let m = r.text();
        assert!(m.contains("\nringgate_access_log_dropped_total 0\n"), "{m}");

        gw.stop();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(!text.contains(SECRET), "the key's secret is never logged");
        assert!(!text.contains(MARKER), "bodies are never logged");
        let lines = lines_of(&text);
        // the scrape is a request too
        assert_eq!(lines.len(), sent + 1, "{driver}:\n{text}");
        let lines: Vec<_> = ids
            .iter()
            .map(|id| {
                let l = lines.iter().find(|l| l["request_id"] == id.as_str());
                l.unwrap_or_else(|| panic!("{driver}: no line for {id}:\n{text}"))
                    .clone()
            })
            .collect();
        for l in &lines {
            for f in [
                "time",
                "request_id",
                "key",
                "endpoint",
                "model",
                "deployment",
                "provider",
                "status",
                "stream",
                "tokens_in",
                "tokens_out",
                "latency_ms",
                "overhead_ms",
                "upstream_ms",
                "ttft_ms",
                "bytes_in",
                "bytes_out",
                "attempts",
            ] {
                assert!(l.get(f).is_some(), "{f} missing in {l}");
            }
            let t = l["time"].as_str().unwrap();
            assert!(
                t.len() == 24 && t.ends_with('Z') && t.as_bytes()[10] == b'T',
                "RFC 3339 UTC: {t}"
            );
            assert!(l["latency_ms"].as_f64().unwrap() >= l["overhead_ms"].as_f64().unwrap());
            assert!(l["bytes_out"].as_u64().unwrap() > 0, "{l}");
        }
        let first = &lines[0];
        assert_eq!(first["request_id"], "client-id_1.a:b");
        assert_eq!(first["key"], "team-a");
        assert_eq!(first["endpoint"], "chat_completions");
        assert_eq!(first["model"], "gpt-4o-mini");
        assert_eq!(first["deployment"], "local/gpt-4o-mini");
        assert_eq!(first["provider"], "local");
        assert_eq!(first["status"], 200);
        assert_eq!(first["stream"], false);
        assert_eq!(first["attempts"], 1);
        assert!(first["tokens_in"].as_u64().unwrap() > 0, "{first}");
        assert_eq!(first["tokens_out"], 4, "{first}");
        assert!(first["bytes_in"].as_u64().unwrap() > chat(false).len() as u64);
        assert!(first["ttft_ms"].is_null());
        let stream = &lines[1];
        assert_eq!(stream["request_id"].as_str(), Some(replaced.as_str()));
        assert_eq!(stream["stream"], true);
        assert!(stream["ttft_ms"].as_f64().is_some(), "{stream}");
        assert_eq!(lines[3]["endpoint"], "responses");
        assert_eq!(lines[3]["request_id"].as_str(), Some(generated.as_str()));
        let unauth = &lines[4];
        assert_eq!(unauth["request_id"].as_str(), Some(unauth_id.as_str()));
        assert_eq!(unauth["status"], 401);
        assert!(unauth["key"].is_null() && unauth["deployment"].is_null());
        assert_eq!(lines[5]["status"], 404);
        assert!(lines[5]["deployment"].is_null());
        assert_eq!(lines[6]["endpoint"], "other");
        assert_eq!(lines[7]["status"], 400);
        assert_eq!(lines[8]["endpoint"], "metrics");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// `access = "stdout"` from the binary: lines arrive while it runs (flushed every 100 ms);
/// with no `[log]` section nothing is written to stdout.
#[test]
fn stdout_mode_from_the_binary_and_off_by_default() {
    common::shard_counts().for_each(stdout_mode_from_the_binary_and_off_by_default_at);
}

fn stdout_mode_from_the_binary_and_off_by_default_at(shards: usize) {
    let mock = start_mock(Profile::Instant, "epoll");
    let dir = std::env::temp_dir().join(format!("rg-accesslog-bin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (name, log) in [("on", "[log]\naccess = \"stdout\"\n"), ("off", "")] {
        let cfg = dir.join(format!("{name}.toml"));
        std::fs::write(
            &cfg,
            format!(
                "[server]\nlisten = \"127.0.0.1:0\"\nshards = {shards}\n{log}\
                 [[provider]]\nname = \"local\"\nkind = \"openai\"\nbase_url = \"http://{}/v1\"\n\
                 [[model]]\nname = \"gpt-4o-mini\"\nprovider = \"local\"\n",
                mock.addr
            ),
        )
        .unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_ringgate"))
            .args(["serve", "--config", cfg.to_str().unwrap()])
            .env_remove("OPENAI_API_KEY")
            .env_remove("RINGGATE_CONFIG")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (tx, rx) = std::sync::mpsc::channel::<(bool, String)>();
        for (is_out, pipe) in [
            (
                true,
                Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
            ),
            (false, Box::new(child.stderr.take().unwrap())),
        ] {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(pipe).lines() {
                    let Ok(line) = line else { break };
                    if tx.send((is_out, line)).is_err() {
                        break;
                    }
                }
            });
        }
        let addr: SocketAddr = loop {
            let (is_out, line) = rx
                .recv_timeout(Duration::from_secs(20))
                .expect("no 'listening on' line");
            assert!(!is_out, "{name}: stdout before any request: {line}");
            if let Some(rest) = line.split("listening on http://").nth(1) {
                break rest.split_whitespace().next().unwrap().parse().unwrap();
            }
        };
        for stream in [false, true] {
            let r = request(addr, &post("/v1/chat/completions", &chat(stream)));
            assert_eq!(r.status, 200, "{}", r.text());
            assert!(r.header("x-request-id").is_some());
        }
        let mut out = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(if name == "on" { 10 } else { 1 });
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match rx.recv_timeout(left) {
                Ok((true, line)) => {
                    out.push(line);
                    if out.len() == 2 {
                        break;
                    }
                }
                Ok((false, _)) => {}
                Err(_) => break,
            }
        }
        let _ = child.kill();
        let _ = child.wait();
        if name == "on" {
            let lines = lines_of(&out.join("\n"));
            assert_eq!(lines.len(), 2, "{out:?}");
            // in either order: at two shards each shard writes its own lines
            let mut streams: Vec<bool> = lines.iter().map(|l| l["stream"] == true).collect();
            streams.sort();
            assert_eq!(streams, [false, true], "{out:?}");
            assert!(lines
                .iter()
                .all(|l| l["key"].is_null() && l["status"] == 200));
            assert!(!out.join("\n").contains(MARKER));
        } else {
            assert!(out.is_empty(), "access log is off by default: {out:?}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::io::stderr().flush();
}
