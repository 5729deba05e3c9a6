//! Real llama.cpp engines for tests: `llama-server` processes (built by `.ci/llama-engine`,
//! found through `LLAMA_SERVER` / `LLAMA_MODEL`) started on 127.0.0.1 port 0 with one thread
//! each, `-np 2`, pinned to CPU 1 when `taskset` is there; killed (by their own PID) when
//! dropped. Without the two variables a test skips with a message, unless
//! `RINGGATE_REQUIRE_LLAMA` is set (`.ci/run`): then it fails.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The model name every engine serves (`--alias`).
pub const ALIAS: &str = "smollm2";

/// Tests that start engines run one at a time (they share CPU 1).
static SERIAL: Mutex<()> = Mutex::new(());

pub fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// `(llama-server, model)` or `None` (skipped, said on stderr).
pub fn paths() -> Option<(PathBuf, PathBuf)> {
    let server = std::env::var_os("LLAMA_SERVER").map(PathBuf::from);
    let model = std::env::var_os("LLAMA_MODEL").map(PathBuf::from);
    match (server, model) {
        (Some(s), Some(m)) if s.is_file() && m.is_file() => Some((s, m)),
        _ => {
            assert!(
                std::env::var_os("RINGGATE_REQUIRE_LLAMA").is_none(),
                "LLAMA_SERVER / LLAMA_MODEL are not set (or missing) but RINGGATE_REQUIRE_LLAMA \
                 is: eval \"$(.ci/llama-engine env)\""
            );
            eprintln!(
                "SKIPPED: no real llama-server (eval \"$(.ci/llama-engine env)\" to run these)"
            );
            None
        }
    }
}

pub struct Llama {
    child: Option<Child>,
    pub addr: SocketAddr,
    pub log: PathBuf,
    server: PathBuf,
    model: PathBuf,
    alias: Option<String>,
    extra: Vec<String>,
}

static SEQ: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

impl Llama {
    /// A started engine serving `ALIAS` on a free port (its `/health` is 200), with `extra`
    /// arguments.
    pub fn start(paths: &(PathBuf, PathBuf), extra: &[&str]) -> Llama {
        Llama::start_as(paths, Some(ALIAS), extra)
    }

    /// As `start`, named `alias` (`None`: no `--alias`, the engine names itself by its GGUF
    /// path).
    pub fn start_as(paths: &(PathBuf, PathBuf), alias: Option<&str>, extra: &[&str]) -> Llama {
        let mut l = Llama {
            child: None,
            addr: "127.0.0.1:0".parse().unwrap(),
            log: std::env::temp_dir().join(format!(
                "ringgate-llama-{}-{}.log",
                std::process::id(),
                SEQ.fetch_add(1, Ordering::Relaxed)
            )),
            server: paths.0.clone(),
            model: paths.1.clone(),
            alias: alias.map(str::to_string),
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        l.spawn(0);
        l
    }

    fn spawn(&mut self, port: u16) {
        let log = std::fs::File::create(&self.log).unwrap();
        let pinned = Command::new("taskset")
            .args(["-c", "1", "true"])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        let mut cmd = if pinned {
            let mut c = Command::new("taskset");
            c.args(["-c", "1"]).arg(&self.server);
            c
        } else {
            Command::new(&self.server)
        };
        cmd.arg("-m")
            .arg(&self.model)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["-t", "1", "-tb", "1", "-np", "2", "-c", "4096"])
            .arg("--no-warmup")
            .args(self.alias.iter().flat_map(|a| ["--alias", a.as_str()]))
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        let child = cmd.spawn().expect("start llama-server");
        self.child = Some(child);
        let t0 = Instant::now();
        // its log names the port it bound, then /health turns 200 once the model is loaded
        let addr = loop {
            let text = std::fs::read_to_string(&self.log).unwrap_or_default();
            if let Some(port) = text
                .split("listening on http://127.0.0.1:")
                .nth(1)
                .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
                .and_then(|p| p.parse::<u16>().ok())
            {
                break SocketAddr::from(([127, 0, 0, 1], port));
            }
            self.check_alive(&text);
            assert!(
                t0.elapsed() < Duration::from_secs(120),
                "llama-server never listened:\n{text}"
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        self.addr = addr;
        self.wait_health();
    }

    fn check_alive(&mut self, text: &str) {
        if let Some(c) = self.child.as_mut() {
            if let Ok(Some(st)) = c.try_wait() {
                panic!("llama-server exited ({st}):\n{text}");
            }
        }
    }

    pub fn wait_health(&mut self) {
        let t0 = Instant::now();
        loop {
            if get_status(self.addr, "/health") == Some(200) {
                return;
            }
            let text = std::fs::read_to_string(&self.log).unwrap_or_default();
            self.check_alive(&text);
            assert!(
                t0.elapsed() < Duration::from_secs(120),
                "llama-server never healthy:\n{text}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGKILL (a crash), reaped.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Start it again on the same port, with the same arguments; returns once `/health` is 200.
    pub fn restart(&mut self) {
        self.kill();
        let port = self.addr.port();
        let t0 = Instant::now();
        // the old socket is gone once the process is reaped; retry the bind for a while anyway
        loop {
            let log = self.log.clone();
            self.log = log.with_extension("restart.log");
            let result =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.spawn(port)));
            if result.is_ok() {
                return;
            }
            self.kill();
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "cannot restart on port {port}"
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    pub fn get(&self, path: &str) -> (u16, String) {
        get_text(self.addr, path).unwrap_or((0, String::new()))
    }

    /// Busy slots per `/slots` (`is_processing`).
    pub fn busy_slots(&self) -> usize {
        let (st, body) = self.get("/slots");
        if st != 200 {
            return 0;
        }
        let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter(|s| s["is_processing"].as_bool() == Some(true))
                    .count()
            })
            .unwrap_or(0)
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Llama {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_file(&self.log);
        let _ = std::fs::remove_file(self.log.with_extension("restart.log"));
    }
}

pub fn get_text(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(30))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut buf = Vec::new();
    let r = super::common::read_response(&mut s, &mut buf)?;
    Some((r.status, r.text()))
}

pub fn get_status(addr: SocketAddr, path: &str) -> Option<u16> {
    get_text(addr, path).map(|(s, _)| s)
}

/// A streaming request held open: its bytes are read (and kept) on a thread until it ends
/// or `close` is called.
pub struct Held {
    stream: TcpStream,
    pub got: Arc<Mutex<Vec<u8>>>,
    done: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Held {
    pub fn open(addr: SocketAddr, path: &str, body: &str) -> Held {
        let mut stream = TcpStream::connect(addr).unwrap();
        stream.write_all(&super::common::post(path, body)).unwrap();
        let got = Arc::new(Mutex::new(Vec::new()));
        let done = Arc::new(AtomicBool::new(false));
        let (g, d, mut r) = (got.clone(), done.clone(), stream.try_clone().unwrap());
        let thread = std::thread::spawn(move || {
            let mut chunk = [0u8; 8192];
            loop {
                match r.read(&mut chunk) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => g.lock().unwrap().extend_from_slice(&chunk[..n]),
                }
            }
            d.store(true, Ordering::SeqCst);
        });
        Held {
            stream,
            got,
            done,
            thread: Some(thread),
        }
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.got.lock().unwrap()).into_owned()
    }

    pub fn is_done(&self) -> bool {
        self.done.load(Ordering::SeqCst)
    }

    /// Whether the response's chunked body has ended (the terminating `0\r\n\r\n`).
    pub fn body_ended(&self) -> bool {
        self.got.lock().unwrap().ends_with(b"\r\n0\r\n\r\n")
    }

    /// Wait up to `limit` for `ok(text)`.
    pub fn wait(&self, limit: Duration, ok: impl Fn(&str) -> bool) -> bool {
        let t0 = Instant::now();
        while t0.elapsed() < limit {
            if ok(&self.text()) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        ok(&self.text())
    }

    pub fn close(mut self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Wait up to `limit` for `ok()`, polling every 20 ms.
pub fn until(limit: Duration, ok: impl Fn() -> bool) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        if ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    ok()
}
