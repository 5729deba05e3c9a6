//! Unix-socket upstreams (`base_url = "unix:/path/engine.sock:/v1"`): the gateway in front of a
//! co-located engine on a real Unix socket (a small std server in this file, one thread per
//! connection) — non-stream and stream answers, pooled reuse, stale bytes on a pooled
//! connection, a reused connection closed before answering (retried once), and the engine
//! restarting (socket gone → 502 in the client's dialect, then back), at both drivers and 1 and
//! 2 shards.

#[path = "../common/mod.rs"]
mod common;

use std::io::Write;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use ringgate::config::Config;
use ringgate::server::{self, Running};

const CHAT: &str = r#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}"#;
const CHAT_STREAM: &str =
    r#"{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
const MESSAGES: &str =
    r#"{"model":"gpt-4o-mini","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}"#;

/// A fresh socket path for one test variant (removed first; the engine binds it).
fn socket_path(tag: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let n = N.fetch_add(1, Ordering::SeqCst);
    let p = std::env::temp_dir().join(format!("rg-up-{}-{tag}-{n}.sock", std::process::id()));
    let _ = std::fs::remove_file(&p);
    p
}

type Answer = dyn Fn(&mut UnixStream, usize, &[u8]) -> bool + Send + Sync;

/// An engine on a Unix socket: every accepted connection is served on its own thread; for each
/// request read, `answer(stream, n, request)` (n counts requests from 1) writes what it likes
/// and returns whether to keep the connection open. `stop` closes the listener, every open
/// connection and removes the socket (an engine that went away).
struct Engine {
    path: PathBuf,
    accepted: Arc<AtomicUsize>,
    /// Every request's head and body, as received.
    requests: Arc<Mutex<Vec<String>>>,
    conns: Arc<Mutex<Vec<UnixStream>>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
}

impl Engine {
    fn start(path: &Path, answer: Arc<Answer>) -> Engine {
        let l = UnixListener::bind(path).unwrap();
        let e = Engine {
            path: path.to_path_buf(),
            accepted: Arc::default(),
            requests: Arc::default(),
            conns: Arc::default(),
            stop: Arc::default(),
        };
        let (accepted, requests, conns, stop) = (
            e.accepted.clone(),
            e.requests.clone(),
            e.conns.clone(),
            e.stop.clone(),
        );
        let count = Arc::new(AtomicUsize::new(0));
        std::thread::spawn(move || {
            for s in l.incoming() {
                if stop.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(mut s) = s else { return };
                accepted.fetch_add(1, Ordering::SeqCst);
                conns.lock().unwrap().push(s.try_clone().unwrap());
                let (answer, count, requests) = (answer.clone(), count.clone(), requests.clone());
                std::thread::spawn(move || {
                    while let Some(req) = read_request(&mut s) {
                        requests
                            .lock()
                            .unwrap()
                            .push(String::from_utf8_lossy(&req).into_owned());
                        let n = count.fetch_add(1, Ordering::SeqCst) + 1;
                        if !answer(&mut s, n, &req) {
                            // a close, though `conns` holds a clone of the socket
                            let _ = s.shutdown(std::net::Shutdown::Both);
                            return;
                        }
                    }
                });
            }
        });
        e
    }

    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        // wake the accept loop so it sees `stop` and drops the listener
        let _ = UnixStream::connect(&self.path);
        for c in self.conns.lock().unwrap().drain(..) {
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A chat completion answering request `n`.
fn chat_json(n: usize) -> Vec<u8> {
    json_response(&format!(
        r#"{{"id":"c{n}","object":"chat.completion","created":1,"model":"m","choices":[{{"index":0,"message":{{"role":"assistant","content":"answer {n}"}},"finish_reason":"stop"}}],"usage":{{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}}}"#
    ))
}

/// A chunked SSE answer of `events` content events and the terminal ones.
fn chat_sse(events: usize) -> Vec<u8> {
    let mut body = String::new();
    for i in 0..events {
        body.push_str(&format!(
            "data: {{\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"t{i} \"}},\"finish_reason\":null}}]}}\n\n"
        ));
    }
    body.push_str("data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n");
    let mut out =
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
            .to_vec();
    out.extend_from_slice(format!("{:x}\r\n{body}\r\n0\r\n\r\n", body.len()).as_bytes());
    out
}

/// The gateway with `v`'s driver and shards, its one provider at `base_url`.
fn gateway(base_url: &str, v: Variant) -> Running {
    quiet_logs();
    let Variant { driver, shards } = v;
    let text = format!(
        r#"
[server]
listen = "127.0.0.1:0"
shards = {shards}
pin = false
driver = "{driver}"

[upstream]
first_byte_timeout_ms = 5000

[routing]
# one attempt per request: a request while the engine is down is one breaker failure
max_attempts = 1

[[provider]]
name = "engine"
kind = "openai-compatible"
base_url = "{base_url}"

[[model]]
name = "gpt-4o-mini"
provider = "engine"
"#
    );
    server::start(Config::parse(&text).unwrap()).unwrap()
}

fn unix_url(p: &Path) -> String {
    format!("unix:{}:/v1", p.display())
}

#[test]
fn non_stream_and_stream_answers_come_over_the_socket_with_host_localhost() {
    for v in variants() {
        let path = socket_path("answers");
        let up = Engine::start(
            &path,
            Arc::new(|s: &mut UnixStream, n: usize, req: &[u8]| {
                let stream = String::from_utf8_lossy(req).contains("\"stream\":true");
                let out = if stream { chat_sse(20) } else { chat_json(n) };
                s.write_all(&out).is_ok()
            }),
        );
        let gw = gateway(&unix_url(&path), v);
        let r = request(gw.addr, &post("/v1/chat/completions", CHAT));
        assert_eq!(r.status, 200, "{v}: {}", r.text());
        assert_eq!(
            r.json()["choices"][0]["message"]["content"],
            "answer 1",
            "{v}"
        );
        let r = request(gw.addr, &post("/v1/chat/completions", CHAT_STREAM));
        assert_eq!(r.status, 200, "{v}: {}", r.text());
        let (content, n, done) = sse_content(&r.body);
        assert!(done, "{v}: the stream ends with [DONE]: {}", r.text());
        assert_eq!(n, 22, "{v}: every event arrives: {}", r.text());
        let want: String = (0..20).map(|i| format!("t{i} ")).collect();
        assert_eq!(content, want, "{v}");
        let reqs = up.requests.lock().unwrap().clone();
        assert_eq!(reqs.len(), 2, "{v}");
        for q in &reqs {
            assert!(
                q.starts_with("POST /v1/chat/completions HTTP/1.1\r\n"),
                "{v}: {q}"
            );
            assert!(
                q.to_ascii_lowercase().contains("\r\nhost: localhost\r\n"),
                "{v}: the Host header names no socket path: {q}"
            );
        }
        gw.stop();
        up.stop();
    }
}

#[test]
fn sequential_requests_reuse_pooled_socket_connections() {
    for v in variants() {
        let path = socket_path("pool");
        let up = Engine::start(
            &path,
            Arc::new(|s: &mut UnixStream, n: usize, _: &[u8]| s.write_all(&chat_json(n)).is_ok()),
        );
        let gw = gateway(&unix_url(&path), v);
        // One client connection: its requests stay on one shard, so on one upstream pool.
        let mut s = connect(gw.addr);
        let mut buf = Vec::new();
        for i in 1..=10 {
            s.write_all(&post("/v1/chat/completions", CHAT)).unwrap();
            let r = read_response(&mut s, &mut buf).expect("an answer");
            assert_eq!(r.status, 200, "{v}: {}", r.text());
            assert_eq!(
                r.json()["choices"][0]["message"]["content"],
                format!("answer {i}"),
                "{v}"
            );
        }
        assert_eq!(
            up.accepted(),
            1,
            "{v}: ten requests in a row on one shard, one socket connection"
        );
        gw.stop();
        up.stop();
    }
}

#[test]
fn bytes_sent_after_a_complete_response_never_reach_the_next_request() {
    for v in variants() {
        // Late: the extra response comes 20 ms after the first (the pooled connection is idle
        // by then); glued: in the same write (already buffered when the first one ends).
        for late in [true, false] {
            let path = socket_path("stale");
            let up = Engine::start(
                &path,
                Arc::new(move |s: &mut UnixStream, n: usize, _: &[u8]| {
                    let mut out = chat_json(n);
                    if late {
                        s.write_all(&out).unwrap();
                        out.clear();
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    out.extend_from_slice(&json_response(r#"{"bogus":true}"#));
                    let _ = s.write_all(&out);
                    true
                }),
            );
            let gw = gateway(&unix_url(&path), v);
            let mut s = connect(gw.addr);
            let mut buf = Vec::new();
            s.write_all(&post("/v1/chat/completions", CHAT)).unwrap();
            let r = read_response(&mut s, &mut buf).expect("an answer");
            assert_eq!(r.json()["choices"][0]["message"]["content"], "answer 1");
            std::thread::sleep(Duration::from_millis(100));
            // the same client connection: the same shard, the same pool
            s.write_all(&post("/v1/chat/completions", CHAT)).unwrap();
            let r = read_response(&mut s, &mut buf).expect("an answer");
            assert_eq!(r.status, 200, "{v}: {}", r.text());
            assert_eq!(
                r.json()["choices"][0]["message"]["content"],
                "answer 2",
                "{v} late={late}: the second request gets its own answer, not stale bytes: {}",
                r.text()
            );
            assert_eq!(
                up.accepted(),
                2,
                "{v} late={late}: the connection with stray bytes was not reused"
            );
            gw.stop();
            up.stop();
        }
    }
}

#[test]
fn a_reused_connection_closed_before_answering_is_retried_once_on_a_fresh_one() {
    for v in variants() {
        let path = socket_path("retry");
        // Per connection: answer its first request; read the second and close unanswered.
        let up = Engine::start(
            &path,
            Arc::new(|s: &mut UnixStream, n: usize, req: &[u8]| {
                let _ = req;
                let first = n % 2 == 1;
                if first {
                    s.write_all(&chat_json(n)).unwrap();
                }
                first
            }),
        );
        let gw = gateway(&unix_url(&path), v);
        let mut s = connect(gw.addr);
        let mut buf = Vec::new();
        for _ in 0..3 {
            s.write_all(&post("/v1/chat/completions", CHAT)).unwrap();
            let r = read_response(&mut s, &mut buf).expect("an answer");
            assert_eq!(r.status, 200, "{v}: {}", r.text());
        }
        wait_metric(
            gw.addr,
            "ringgate_upstream_retries_total",
            2,
            &format!(
                "{v}: requests 2 and 3 found the pooled connection quiet, lost it, retried once"
            ),
        );
        assert_eq!(up.accepted(), 3, "{v}: one fresh connection per retry");
        gw.stop();
        up.stop();
    }
}

#[test]
fn an_engine_restart_is_a_502_in_the_clients_dialect_then_answers_again() {
    for v in variants() {
        let path = socket_path("restart");
        let answer: Arc<Answer> =
            Arc::new(|s: &mut UnixStream, n: usize, _: &[u8]| s.write_all(&chat_json(n)).is_ok());
        let up = Engine::start(&path, answer.clone());
        let gw = gateway(&unix_url(&path), v);
        let mut s = connect(gw.addr);
        let mut buf = Vec::new();
        s.write_all(&post("/v1/chat/completions", CHAT)).unwrap();
        let r = read_response(&mut s, &mut buf).expect("an answer");
        assert_eq!(r.status, 200, "{v}: {}", r.text());

        // The engine goes away: its pooled connection closes, its socket file is removed.
        up.stop();
        std::thread::sleep(Duration::from_millis(200));
        s.write_all(&post("/v1/chat/completions", CHAT)).unwrap();
        let r = read_response(&mut s, &mut buf).expect("an answer");
        assert_eq!(r.status, 502, "{v}: {}", r.text());
        assert_eq!(
            r.json()["error"]["code"],
            "upstream_connect_error",
            "{v}: an OpenAI-shaped error: {}",
            r.text()
        );
        let r = request(gw.addr, &post("/v1/messages", MESSAGES));
        assert_eq!(r.status, 502, "{v}: {}", r.text());
        assert_eq!(
            r.json()["type"],
            "error",
            "{v}: an Anthropic client gets an Anthropic-shaped error: {}",
            r.text()
        );

        // Back on the same path: the next requests are answered.
        let up = Engine::start(&path, answer);
        s.write_all(&post("/v1/chat/completions", CHAT)).unwrap();
        let r = read_response(&mut s, &mut buf).expect("an answer");
        assert_eq!(r.status, 200, "{v}: {}", r.text());
        let r = request(gw.addr, &post("/v1/messages", MESSAGES));
        assert_eq!(r.status, 200, "{v}: {}", r.text());
        assert_eq!(r.json()["type"], "message", "{v}: {}", r.text());
        assert!(
            (1..=v.shards).contains(&up.accepted()),
            "{v}: at most one fresh connection per shard: {}",
            up.accepted()
        );
        gw.stop();
        up.stop();
    }
}

#[test]
fn check_refuses_a_malformed_unix_base_url_with_a_clear_reason() {
    for (url, why) in [
        ("unix:run/vllm.sock", "must be absolute"),
        ("unix:/run/vllm.sock:v1", "must start with '/'"),
        ("unix:/run/vllm.sock:", "nothing after"),
    ] {
        let text = format!(
            "[[provider]]\nname = \"e\"\nkind = \"openai-compatible\"\nbase_url = \"{url}\"\n\n[[model]]\nname = \"m\"\nprovider = \"e\"\n"
        );
        let e = format!("{:?}", Config::parse(&text).unwrap_err());
        assert!(e.contains(why), "{url}: {e}");
    }
}

#[test]
fn check_refuses_an_engine_load_signal_it_cannot_poll_over_the_socket() {
    let text = "[[provider]]\nname = \"e\"\nkind = \"openai-compatible\"\nengine = \"vllm\"\nbase_url = \"unix:/run/vllm.sock:/v1\"\n\n[[model]]\nname = \"m\"\nprovider = \"e\"\n";
    let e = format!("{:?}", Config::parse(text).unwrap_err());
    assert!(
        e.contains("a unix: base_url needs an http:// metrics_url"),
        "{e}"
    );
    let with_url = text.replace(
        "engine = \"vllm\"\n",
        "engine = \"vllm\"\nmetrics_url = \"http://127.0.0.1:8000/metrics\"\n",
    );
    Config::parse(&with_url).unwrap();
}

/// `ringgate doctor --config` on `text`; (exit code, stdout).
fn doctor(text: &str) -> (i32, String) {
    let cfg = socket_path("doctor").with_extension("toml");
    std::fs::write(&cfg, text).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ringgate"))
        .args(["doctor", "--config", cfg.to_str().unwrap()])
        .env_remove("RINGGATE_CONFIG")
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&cfg);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    (out.status.code().unwrap_or(-1), stdout)
}

#[test]
fn doctor_reaches_the_engine_on_its_socket_and_names_a_missing_one() {
    let path = socket_path("doctor");
    let up = Engine::start(
        &path,
        Arc::new(|s: &mut UnixStream, _: usize, req: &[u8]| {
            assert!(req.starts_with(b"GET /v1/models HTTP/1.1\r\n"));
            let _ = s.write_all(&json_response(r#"{"object":"list","data":[{"id":"m"}]}"#));
            false
        }),
    );
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nshards = 1\n\n[[provider]]\nname = \"e\"\nkind = \"openai-compatible\"\nbase_url = \"{}\"\n\n[[model]]\nname = \"m\"\nprovider = \"e\"\n",
        unix_url(&path)
    );
    let (_, out) = doctor(&text);
    let line = out
        .lines()
        .find(|l| l.contains(&format!("e ({})", unix_url(&path))))
        .unwrap_or_else(|| panic!("no line for the provider:\n{out}"));
    assert!(line.trim_start().starts_with("ok "), "{out}");
    assert!(
        line.contains(&format!("socket {}", path.display())),
        "{line}"
    );
    assert!(line.contains("GET /v1/models 200, 1 model(s)"), "{line}");
    up.stop();

    let (code, out) = doctor(&text);
    assert_eq!(code, 1, "a missing socket is a problem to fix:\n{out}");
    assert!(
        out.contains(&format!(
            "FAIL  e ({}): connect to the socket {}",
            unix_url(&path),
            path.display()
        )),
        "{out}"
    );
}
