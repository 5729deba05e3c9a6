//! Config hot reload under load, on the real binary (issue 11's Done-when): 20 reloads
//! alternating SIGHUP and `POST /admin/reload`, each adding a model and removing the previous
//! one, the upstream of a model moved to a second mock server (the first then stopped), one
//! invalid file in the middle and one restart-needed setting — while load threads run streams
//! and non-stream requests on keep-alive connections, with a config key and a key made through
//! the admin API. Asserts: 0 failed requests, every stream complete (`[DONE]`), the new model
//! answers right after each reload and the removed one 404s, the invalid file changes nothing
//! and is reported (with its line, in the log and the admin answer, and counted).

#[path = "../common/mod.rs"]
mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use ringgate::mock::Profile;

const BIN: &str = env!("CARGO_BIN_EXE_ringgate");
const TOKEN: &str = "reload-test-admin-token-5b1e0c9d8f7a";
const CFG_KEY: &str = "rg-reload-config-key-3c2b1a09f8e7";

struct Dir(PathBuf);

impl Dir {
    fn new() -> Dir {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let p = std::env::temp_dir().join(format!("rg-reload-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&p).unwrap();
        Dir(p)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The config of step `step`: model `extra-{step}` added (the previous step's gone), model
/// `remote` on upstream `up`, `server` lines appended to `[server]`.
fn config(dir: &Path, up: SocketAddr, step: usize, server: &str) -> String {
    format!(
        r#"[server]
listen = "127.0.0.1:0"
shards = 2
pin = false
state_dir = "{state}"
{server}

[admin]
listen = "127.0.0.1:0"

[[provider]]
name = "local"
kind = "mock"
profile = "seed"

[[provider]]
name = "up"
kind = "openai-compatible"
base_url = "http://{up}/v1"

[[model]]
name = "steady"
provider = "local"

[[model]]
name = "remote"
provider = "up"

[[model]]
name = "extra-{step}"
provider = "local"

[[key]]
name = "from-config"
key_env = "RG_RELOAD_TEST_KEY"
"#,
        state = dir.join("state").display()
    )
}

/// Replace the file in one step (a reload never reads half a file).
fn write(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

struct Gw {
    child: Child,
    main: SocketAddr,
    admin: SocketAddr,
    log: Arc<Mutex<Vec<String>>>,
}

impl Gw {
    fn start(path: &Path) -> Gw {
        let mut child = Command::new(BIN)
            .arg("--config")
            .arg(path)
            .env("RINGGATE_ADMIN_TOKEN", TOKEN)
            .env("RG_RELOAD_TEST_KEY", CFG_KEY)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                sink.lock().unwrap().push(line);
            }
        });
        let addr_in = |line: &str, what: &str| -> Option<SocketAddr> {
            line.split(what)
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        };
        let until = Instant::now() + Duration::from_secs(20);
        let (mut main, mut admin) = (None, None);
        while Instant::now() < until && (main.is_none() || admin.is_none()) {
            for l in log.lock().unwrap().iter() {
                if let Some(a) = addr_in(l, "admin listening on http://") {
                    admin = Some(a);
                } else if let Some(a) = addr_in(l, " listening on http://") {
                    main = Some(a);
                }
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let (Some(main), Some(admin)) = (main, admin) else {
            panic!("did not start: {:?}", log.lock().unwrap());
        };
        Gw {
            child,
            main,
            admin,
            log,
        }
    }

    fn sighup(&self) {
        let ok = Command::new("kill")
            .args(["-HUP", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(ok.success());
    }

    fn admin(&self, method: &str, path: &str) -> Response {
        let raw = format!(
            "{method} {path} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: 0\r\n\r\n"
        );
        request(self.admin, raw.as_bytes())
    }

    fn running_hash(&self) -> String {
        let r = self.admin("GET", "/admin/config");
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()["hash"].as_str().unwrap().to_string()
    }

    fn logged(&self, needle: &str) -> bool {
        self.log.lock().unwrap().iter().any(|l| l.contains(needle))
    }
}

impl Drop for Gw {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn chat(model: &str, stream: bool, key: &str) -> Vec<u8> {
    let body = format!(
        r#"{{"model":"{model}","stream":{stream},"max_tokens":8,"messages":[{{"role":"user","content":"hi"}}]}}"#
    );
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {key}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// One load thread's requests so far.
#[derive(Default)]
struct Tally {
    ok: AtomicU64,
    streams_done: AtomicU64,
    failed: Mutex<Vec<String>>,
}

/// Requests on one keep-alive connection until `stop`: `model`s in turn, streams or not.
fn load(
    addr: SocketAddr,
    stream: bool,
    models: &'static [&'static str],
    key: String,
    stop: Arc<AtomicBool>,
    tally: Arc<Tally>,
) {
    let mut conn: Option<TcpStream> = None;
    let mut n = 0usize;
    while !stop.load(Ordering::Relaxed) {
        let model = models[n % models.len()];
        n += 1;
        let s = conn.get_or_insert_with(|| connect(addr));
        let mut buf = Vec::new();
        let r = s
            .write_all(&chat(model, stream, &key))
            .ok()
            .and_then(|_| read_response(s, &mut buf));
        let fail = match &r {
            None => Some("no response".to_string()),
            Some(r) if r.status != 200 => Some(format!("{} {}", r.status, r.text())),
            Some(r) if stream && !r.text().contains("data: [DONE]") => {
                Some(format!("stream cut: {}", r.text()))
            }
            Some(r) if !stream && r.json()["choices"][0]["message"]["content"].is_null() => {
                Some(format!("no content: {}", r.text()))
            }
            Some(_) => None,
        };
        match fail {
            Some(f) => {
                tally.failed.lock().unwrap().push(format!("{model}: {f}"));
                conn = None;
            }
            None => {
                tally.ok.fetch_add(1, Ordering::Relaxed);
                if stream {
                    tally.streams_done.fetch_add(1, Ordering::Relaxed);
                }
                if r.as_ref().and_then(|r| r.header("connection")) == Some("close") {
                    conn = None;
                }
            }
        }
    }
}

fn status(addr: SocketAddr, model: &str) -> u16 {
    request(addr, &chat(model, false, CFG_KEY)).status
}

/// Wait until every load thread finished one more request (twice in a row: one that started
/// after the first call).
fn let_load_run(tallies: &[Arc<Tally>]) {
    let base: Vec<u64> = tallies
        .iter()
        .map(|t| t.ok.load(Ordering::Relaxed))
        .collect();
    let until = Instant::now() + Duration::from_secs(10);
    while tallies
        .iter()
        .zip(&base)
        .any(|(t, b)| t.ok.load(Ordering::Relaxed) < b + 1)
    {
        assert!(Instant::now() < until, "load stalled");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn twenty_reloads_under_load_fail_no_request() {
    let t0 = Instant::now();
    let dir = Dir::new();
    let path = dir.0.join("ringgate.toml");
    let mock_a = start_mock(Profile::Seed, "epoll");
    let mock_b = start_mock(Profile::Seed, "epoll");
    let (a, b) = (mock_a.addr, mock_b.addr);
    write(&path, &config(&dir.0, a, 0, ""));
    let gw = Gw::start(&path);
    assert_eq!(status(gw.main, "extra-0"), 200);

    // a runtime key (admin API): it must survive every reload
    let body = r#"{"name":"runtime"}"#;
    let raw = format!(
        "POST /admin/keys HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let r = request(gw.admin, raw.as_bytes());
    assert_eq!(r.status, 201, "{}", r.text());
    let runtime_key = r.json()["key"].as_str().unwrap().to_string();

    let stop = Arc::new(AtomicBool::new(false));
    const BOTH: &[&str] = &["steady", "remote"];
    let plan: [(bool, &'static [&'static str], &str); 5] = [
        (true, BOTH, CFG_KEY),
        (true, &["remote"], CFG_KEY),
        (false, BOTH, CFG_KEY),
        (false, BOTH, runtime_key.as_str()),
        (true, &["steady"], runtime_key.as_str()),
    ];
    let tallies: Vec<Arc<Tally>> = plan.iter().map(|_| Arc::new(Tally::default())).collect();
    let threads: Vec<_> = plan
        .iter()
        .zip(&tallies)
        .map(|((stream, models, key), t)| {
            let (stop, t, key, addr) = (stop.clone(), t.clone(), key.to_string(), gw.main);
            let (stream, models) = (*stream, *models);
            std::thread::spawn(move || load(addr, stream, models, key, stop, t))
        })
        .collect();
    let_load_run(&tallies);

    let mut up = a;
    let mut server = "";
    let mut mock_a = Some(mock_a);
    let mut live_step = 0;
    for step in 1..=20usize {
        if step == 8 {
            up = b; // the `remote` model moves to the second mock
        }
        if step == 14 {
            server = "idle_release_ms = 900"; // only a restart applies it
        }
        let invalid = step == 10;
        let text = if invalid {
            // an unknown provider on a known line, and a type error: nothing of it applies
            config(&dir.0, up, step, "")
                .replace(
                    "provider = \"local\"\n\n[[key]]",
                    "provider = \"nowhere\"\n\n[[key]]",
                )
                .replace("shards = 2", "shards = \"two\"")
        } else {
            config(&dir.0, up, step, server)
        };
        write(&path, &text);
        let want = ringgate::config::text_hash(&text);
        let before = gw.running_hash();
        if step % 2 == 1 {
            gw.sighup();
            let until = Instant::now() + Duration::from_secs(10);
            while gw.running_hash() != want {
                assert!(Instant::now() < until, "SIGHUP {step}: not applied");
                std::thread::sleep(Duration::from_millis(2));
            }
        } else {
            let r = gw.admin("POST", "/admin/reload");
            let v = r.json();
            if invalid {
                assert_eq!(r.status, 422, "{v}");
                assert_eq!(v["status"], "failed");
                assert_eq!(v["hash"].as_str(), Some(before.as_str()), "{v}");
                let problems = v["problems"].as_array().unwrap();
                assert!(!problems.is_empty(), "{v}");
                assert!(problems.iter().all(|p| p["line"].as_u64().is_some()), "{v}");
            } else {
                assert_eq!(r.status, 200, "{v}");
                assert_eq!(v["hash"].as_str(), Some(want.as_str()), "{v}");
                let changes = v["changes"].to_string();
                assert!(
                    changes.contains(&format!("model extra-{step} added")),
                    "{v}"
                );
                assert!(
                    changes.contains(&format!("model extra-{live_step} removed")),
                    "{v}"
                );
                let restart = v["restart_needed"].to_string();
                assert_eq!(
                    restart.contains("server.idle_release_ms"),
                    step >= 14,
                    "{v}"
                );
            }
        }
        if invalid {
            // nothing changed: the running hash, the models
            assert_eq!(gw.running_hash(), before);
            assert_eq!(status(gw.main, &format!("extra-{live_step}")), 200);
            assert_eq!(status(gw.main, &format!("extra-{step}")), 404);
        } else {
            // right after the reload: the new model answers, the removed one is gone
            assert_eq!(
                status(gw.main, &format!("extra-{step}")),
                200,
                "step {step}"
            );
            assert_eq!(
                status(gw.main, &format!("extra-{live_step}")),
                404,
                "step {step}"
            );
            live_step = step;
        }
        let_load_run(&tallies);
        if step == 8 {
            // every request that started on the first mock has ended: stop it; `remote` keeps
            // answering only if it really moved
            let_load_run(&tallies);
            if let Some(m) = mock_a.take() {
                m.stop();
            }
        }
    }
    let_load_run(&tallies);
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }

    let failed: Vec<String> = tallies
        .iter()
        .flat_map(|t| t.failed.lock().unwrap().clone())
        .collect();
    let ok: u64 = tallies.iter().map(|t| t.ok.load(Ordering::Relaxed)).sum();
    let streams: u64 = tallies
        .iter()
        .map(|t| t.streams_done.load(Ordering::Relaxed))
        .sum();
    eprintln!(
        "{ok} requests ok ({streams} streams) over 20 reloads in {:?}",
        t0.elapsed()
    );
    assert!(
        failed.is_empty(),
        "{} failed of {}: {failed:?}",
        failed.len(),
        ok
    );
    assert!(
        ok >= 200 && streams >= 40,
        "too little load: {ok} ok, {streams} streams"
    );

    // the invalid file: logged with its lines, counted
    assert!(
        gw.logged("reload (admin)") && gw.logged(": line "),
        "no problem lines logged"
    );
    let m = gw.admin("GET", "/metrics").text();
    assert!(
        m.contains("ringgate_config_reloads_total{result=\"ok\"} 19"),
        "{m}"
    );
    assert!(
        m.contains("ringgate_config_reloads_total{result=\"error\"} 1"),
        "{m}"
    );
    let hash = gw.running_hash();
    assert!(m.contains(&format!("ringgate_config_info{{hash=\"{hash}\"}} 1")));

    // the running config, as shown: the file's models, no secret
    let c = gw.admin("GET", "/admin/config").json();
    assert_eq!(c["generation"], 19);
    let toml = c["toml"].as_str().unwrap();
    assert!(
        toml.contains("extra-20") && !toml.contains("extra-19"),
        "{toml}"
    );
    assert!(!c.to_string().contains(CFG_KEY) && !c.to_string().contains(TOKEN));
    drop(gw);
    mock_b.stop();
    assert!(
        t0.elapsed() < Duration::from_secs(40),
        "took {:?}",
        t0.elapsed()
    );
}

/// A gateway with one model and one config key on `shards` shards: what issue 20 emptied.
fn small_config(dir: &Path, shards: usize, driver: &str) -> String {
    format!(
        r#"[server]
listen = "127.0.0.1:0"
shards = {shards}
pin = false
driver = "{driver}"
state_dir = "{state}"

[admin]
listen = "127.0.0.1:0"

[[provider]]
name = "local"
kind = "mock"

[[model]]
name = "steady"
provider = "local"

[[model]]
name = "other"
provider = "local"

[[key]]
name = "from-config"
key_env = "RG_RELOAD_TEST_KEY"
"#,
        state = dir.join("state").display()
    )
}

/// A zero-byte file, a whitespace-only one, one cut at a line boundary (no models and no keys
/// left, or no keys left) and one cut before its last newline: each refused — logged, counted,
/// and on `POST /admin/reload` answered 422 with the reason — while the old config keeps
/// serving with the right key; then the explicit form (`[reload] allow_empty = true`) applies.
/// At 1 and 2 shards, on both drivers.
#[test]
fn empty_or_cut_files_are_refused_on_sighup() {
    for shards in [1, 2] {
        for driver in DRIVERS {
            refusals(shards, driver, Trigger::Sighup);
        }
    }
}

/// `empty_or_cut_files_are_refused_on_sighup`, through the admin API.
#[test]
fn empty_or_cut_files_are_refused_on_admin_reload() {
    for shards in [1, 2] {
        for driver in DRIVERS {
            refusals(shards, driver, Trigger::Admin);
        }
    }
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Trigger {
    Sighup,
    Admin,
}

impl Gw {
    /// Reload by `how`; `Some(report)` from the admin API, `None` for SIGHUP once the log shows
    /// a line containing `needle` one more time than before.
    fn reload_by(&self, how: Trigger, needle: &str) -> Option<serde_json::Value> {
        let seen = || {
            let log = self.log.lock().unwrap();
            log.iter().filter(|l| l.contains(needle)).count()
        };
        match how {
            Trigger::Admin => {
                let r = self.admin("POST", "/admin/reload");
                let mut v = r.json();
                v["http_status"] = r.status.into();
                Some(v)
            }
            Trigger::Sighup => {
                let before = seen();
                self.sighup();
                let until = Instant::now() + Duration::from_secs(20);
                while seen() <= before {
                    assert!(
                        Instant::now() < until,
                        "SIGHUP: no log line with {needle:?}"
                    );
                    std::thread::sleep(Duration::from_millis(20));
                }
                None
            }
        }
    }
}

fn refusals(shards: usize, driver: &str, how: Trigger) {
    let dir = Dir::new();
    let path = dir.0.join("ringgate.toml");
    let good = small_config(&dir.0, shards, driver);
    write(&path, &good);
    let gw = Gw::start(&path);
    let hash = gw.running_hash();
    let ctx = format!("{shards} shard(s), {driver}, {how:?}");
    let serving = |what: &str| {
        for model in ["steady", "other"] {
            let r = request(gw.main, &chat(model, false, CFG_KEY));
            assert_eq!(r.status, 200, "{ctx}, {what}: {}", r.text());
        }
        let r = request(
            gw.main,
            &chat("steady", false, "rg-not-a-key-0123456789abcdef"),
        );
        assert_eq!(r.status, 401, "{ctx}, {what}: {}", r.text());
        assert_eq!(
            gw.running_hash(),
            hash,
            "{ctx}, {what}: the running config changed"
        );
    };
    serving("at start");
    let cut_models = &good[..good.find("[[model]]").unwrap()];
    let cut_keys = &good[..good.find("[[key]]").unwrap()];
    let cases: [(&str, &str, &str); 5] = [
        ("empty", "", "is empty (0 bytes)"),
        ("whitespace", " \n\n\t \n", "holds only whitespace"),
        ("cut before the models", cut_models, "no [[model]]"),
        ("cut before the keys", cut_keys, "no [[key]]"),
        (
            "cut in its last line",
            good.trim_end(),
            "does not end with a newline",
        ),
    ];
    for (what, text, why) in cases {
        write(&path, text);
        // the log line names the reason either way: "reload (SIGHUP|admin): FILE: refused: …"
        if let Some(v) = gw.reload_by(how, why) {
            assert_eq!(v["http_status"], 422, "{ctx}, {what}: {v}");
            assert_eq!(v["status"], "failed", "{ctx}, {what}: {v}");
            let problems = v["problems"].to_string();
            assert!(problems.contains(why), "{ctx}, {what}: {v}");
            assert!(
                problems.contains("allow_empty = true") || problems.contains("rename"),
                "{ctx}, {what}: the refusal must say what to write: {v}"
            );
            // the log is read by another thread: it may come after the answer
            let until = Instant::now() + Duration::from_secs(20);
            while !gw.logged(why) {
                assert!(Instant::now() < until, "{ctx}, {what}: not logged");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        assert!(gw.logged("keeping the running config"), "{ctx}");
        serving(what);
    }
    let m = gw.admin("GET", "/metrics").text();
    assert!(
        m.contains(&format!(
            "ringgate_config_reloads_total{{result=\"error\"}} {}",
            cases.len()
        )),
        "{ctx}: {m}"
    );

    // said explicitly: the keys go (their clients get 401), then the models too
    let no_keys = format!("{cut_keys}[reload]\nallow_empty = true\n");
    let nothing = format!("{cut_models}[reload]\nallow_empty = true\n");
    for text in [no_keys, nothing] {
        write(&path, &text);
        let want = ringgate::config::text_hash(&text);
        if let Some(v) = gw.reload_by(how, &want) {
            assert_eq!(v["http_status"], 200, "{ctx}: {v}");
        }
        assert_eq!(gw.running_hash(), want, "{ctx}: allow_empty not applied");
        assert_eq!(
            request(gw.main, &chat("steady", false, CFG_KEY)).status,
            401
        );
    }
}
