//! The `ringgate` binary itself: signals and what `check` / `serve` print.

mod common;

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;

const BIN: &str = env!("CARGO_BIN_EXE_ringgate");

/// A `ringgate serve` child process; killed on drop.
struct Served {
    child: Child,
    addr: SocketAddr,
    /// stderr lines seen so far (the reader thread keeps collecting).
    log: std::sync::mpsc::Receiver<String>,
}

impl Served {
    fn start(args: &[&str]) -> Served {
        let mut child = Command::new(BIN)
            .args(["serve", "--listen", "127.0.0.1:0", "--shards", "1"])
            .args(args)
            .env_remove("OPENAI_API_KEY")
            .env_remove("RINGGATE_CONFIG")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
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
        let addr = loop {
            let line = rx
                .recv_timeout(Duration::from_secs(20))
                .expect("no 'listening on' line from ringgate serve");
            if let Some(rest) = line.split("listening on http://").nth(1) {
                break rest.split_whitespace().next().unwrap().parse().unwrap();
            }
        };
        Served {
            child,
            addr,
            log: rx,
        }
    }

    fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill {sig} failed");
    }

    /// Wait for a stderr line containing `needle`.
    fn wait_log(&self, needle: &str) -> bool {
        let until = std::time::Instant::now() + Duration::from_secs(10);
        while let Some(left) = until.checked_duration_since(std::time::Instant::now()) {
            match self.log.recv_timeout(left) {
                Ok(l) if l.contains(needle) => return true,
                Ok(_) => {}
                Err(_) => return false,
            }
        }
        false
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn sighup_without_a_config_file_keeps_serving() {
    // the built-in config: SIGHUP reloads (tests/reload.rs), but there is no file to read
    let mut s = Served::start(&[]);
    assert_eq!(request(s.addr, &get("/healthz")).status, 200);
    s.signal("-HUP");
    assert!(
        s.wait_log("reload (SIGHUP): (built-in): no config file to reload"),
        "no SIGHUP log line"
    );
    assert!(
        s.child.try_wait().unwrap().is_none(),
        "the process died on SIGHUP"
    );
    assert_eq!(request(s.addr, &get("/healthz")).status, 200);
    let r = request(
        s.addr,
        &post(
            "/v1/chat/completions",
            r#"{"model":"mock","messages":[{"role":"user","content":"hi"}]}"#,
        ),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    // SIGTERM still drains and exits.
    s.signal("-TERM");
    assert!(s.wait_log("draining"), "no drain on SIGTERM");
    let until = std::time::Instant::now() + Duration::from_secs(10);
    while s.child.try_wait().unwrap().is_none() {
        assert!(std::time::Instant::now() < until, "did not exit on SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn config_with_credentials() -> (std::path::PathBuf, &'static str) {
    let dir = std::env::temp_dir().join(format!("ringgate-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("creds.toml");
    std::fs::write(
        &path,
        "[[provider]]\nname = \"p\"\nkind = \"openai\"\nbase_url = \"http://alice:s3cr3t-pw@127.0.0.1:9/v1\"\n\n[[model]]\nname = \"m\"\nprovider = \"p\"\n",
    )
    .unwrap();
    (path, "s3cr3t-pw")
}

#[test]
fn check_and_serve_redact_base_url_password() {
    let (path, secret) = config_with_credentials();
    let out = Command::new(BIN)
        .args(["check", "--config", path.to_str().unwrap()])
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "credentials must be refused: {text}");
    assert!(!text.contains(secret), "check printed the password: {text}");
    assert!(text.contains("alice:***@127.0.0.1:9"), "{text}");

    let mut child = Command::new(BIN)
        .args(["serve", "--config", path.to_str().unwrap()])
        .args(["--listen", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    let status = child.wait().unwrap();
    assert!(!status.success(), "{err}");
    assert!(!err.contains(secret), "serve printed the password: {err}");
    assert!(err.contains("alice:***@"), "{err}");
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}
