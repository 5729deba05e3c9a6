//! The `ringgate` binary itself: signals and what `check` / `serve` print.

#[path = "../common/mod.rs"]
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
    /// stderr up to and including the "listening on" line.
    early: Vec<String>,
}

impl Served {
    /// `ringgate serve` on port 0 with `args` (one shard unless they say `--shards`).
    fn start(args: &[&str]) -> Served {
        let one = if args.contains(&"--shards") {
            &[][..]
        } else {
            &["--shards", "1"][..]
        };
        let mut child = Command::new(BIN)
            .args(["serve", "--listen", "127.0.0.1:0"])
            .args(one)
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
        let mut early = Vec::new();
        let addr = loop {
            let line = rx
                .recv_timeout(Duration::from_secs(20))
                .unwrap_or_else(|_| {
                    panic!("no 'listening on' line from ringgate serve: {early:?}")
                });
            early.push(line.clone());
            if let Some(rest) = line.split("listening on http://").nth(1) {
                break rest.split_whitespace().next().unwrap().parse().unwrap();
            }
        };
        Served {
            child,
            addr,
            log: rx,
            early,
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
    common::shard_counts().for_each(sighup_without_a_config_file_keeps_serving_at);
}

fn sighup_without_a_config_file_keeps_serving_at(shards: usize) {
    // the built-in config: SIGHUP reloads (tests/control/reload.rs), but there is no file to read
    let mut s = Served::start(&["--shards", &shards.to_string()]);
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

/// A directory of its own for one test (removed on drop).
struct Tmp(std::path::PathBuf);

impl Tmp {
    fn new(what: &str) -> Tmp {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let p = std::env::temp_dir().join(format!("rg-cli-{what}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&p).unwrap();
        Tmp(p)
    }

    fn file(&self, name: &str, text: &str) -> std::path::PathBuf {
        let p = self.0.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }
}

impl Drop for Tmp {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `ringgate ARGS…` → (exit code, stdout + stderr).
fn run(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .env_remove("RINGGATE_CONFIG")
        .env_remove("OPENAI_API_KEY");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}

#[test]
fn help_lists_every_serve_option() {
    let (code, text) = run(&["--help"], &[]);
    assert_eq!(code, Some(0));
    // the serve usage (before `check`) names --config, --listen and --shards
    let serve = &text[..text.find("ringgate check").unwrap()];
    for opt in ["--config", "--listen", "--shards"] {
        assert!(
            serve.contains(opt),
            "{opt} missing from serve's usage:\n{text}"
        );
    }
}

#[test]
fn check_prints_every_problem() {
    let t = Tmp::new("every");
    let path = t.file("c.toml", &format!(
        "[server]\nlisten = \"0.0.0.0:8080\"\nstate_dir = \"{}\"\n\n[admin]\nlisten = \"127.0.0.1:0\"\n\n[[provider]]\nname = \"p\"\nkind = \"mock\"\n\n[[model]]\nname = \"a\"\nprovider = \"nope\"\n\n[[model]]\nname = \"b\"\nprovider = \"gone\"\n",
        t.0.join("c.toml").display()
    ));
    let (code, text) = run(&["check", "--config", path.to_str().unwrap()], &[]);
    assert_eq!(code, Some(1), "{text}");
    for want in [
        "line 14: model \"a\" refers to unknown provider \"nope\"",
        "line 18: model \"b\" refers to unknown provider \"gone\"",
        "refusing to listen on 0.0.0.0:8080 without keys",
        "is not a directory",
        "4 problem(s) found",
    ] {
        assert!(text.contains(want), "{want:?} missing:\n{text}");
    }
}

/// `check`, `doctor` and `serve` agree about a state_dir: each bad one refused by all three
/// with the same reason, and a good one accepted by all three.
#[test]
fn check_doctor_and_serve_share_the_state_dir_check() {
    let t = Tmp::new("state");
    let plain = t.file("plain-file", "not a directory\n");
    std::fs::create_dir_all(t.0.join("garbage")).unwrap();
    t.file("garbage/state.db", "this is not an SQLite database, just text ......................................................................................................\n");
    let cases = [
        (plain.display().to_string(), "is not a directory"),
        (plain.join("sub").display().to_string(), "cannot be created"),
        (t.0.join("garbage").display().to_string(), "state.db"),
        (String::new(), "state_dir is empty"),
        (t.0.join("fresh/state").display().to_string(), ""),
    ];
    for (i, (dir, why)) in cases.iter().enumerate() {
        let path = t.file(&format!("c{i}.toml"), &format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nshards = 1\nstate_dir = \"{dir}\"\n\n[[provider]]\nname = \"p\"\nkind = \"mock\"\n\n[[model]]\nname = \"m\"\nprovider = \"p\"\n\n[[key]]\nname = \"k\"\nkey_env = \"RG_CLI_STATE_KEY\"\n"
        ));
        let p = path.to_str().unwrap();
        let env = [("RG_CLI_STATE_KEY", "rg-cli-state-key-0123456789abcdef")];
        let (check, ctext) = run(&["check", "--config", p], &env);
        let (_, dtext) = run(&["doctor", "--config", p], &env);
        if why.is_empty() {
            assert_eq!(check, Some(0), "{dir}: {ctext}");
            assert!(
                dtext.contains("state_dir") && dtext.contains("is usable"),
                "{dtext}"
            );
            let s = Served::start(&["--config", p]);
            assert_eq!(request(s.addr, &get("/healthz")).status, 200);
            continue;
        }
        assert_eq!(check, Some(1), "check accepted state_dir {dir:?}: {ctext}");
        assert!(ctext.contains(why), "check, {dir:?}: {ctext}");
        let fail = dtext
            .lines()
            .find(|l| l.contains("FAIL") && l.contains(why));
        assert!(
            fail.is_some(),
            "doctor accepted state_dir {dir:?}:\n{dtext}"
        );
        let mut child = Command::new(BIN)
            .args(["serve", "--config", p, "--listen", "127.0.0.1:0"])
            .env("RG_CLI_STATE_KEY", env[0].1)
            .stdout(Stdio::null())
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
        assert!(
            !child.wait().unwrap().success(),
            "serve started with {dir:?}: {err}"
        );
        assert!(err.contains(why), "serve, {dir:?}: {err}");
    }
}

/// Two config files on one box get two state dirs by default (keys, budgets and the spend
/// ledger are not shared); the same file gets the same one again.
#[test]
fn the_default_state_dir_is_one_per_config_file() {
    let t = Tmp::new("default-state");
    let data = t.0.join("data");
    let text = "[server]\nlisten = \"127.0.0.1:0\"\n\n[admin]\nlisten = \"127.0.0.1:0\"\n\n[[provider]]\nname = \"p\"\nkind = \"mock\"\n\n[[model]]\nname = \"m\"\nprovider = \"p\"\n";
    let a = t.file("a.toml", text);
    std::fs::create_dir_all(t.0.join("other")).unwrap();
    let b = t.file("other/a.toml", text);
    let state_of = |path: &std::path::Path| {
        let mut child = Command::new(BIN)
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--shards",
                "1",
                "--config",
            ])
            .arg(path)
            .env("XDG_DATA_HOME", &data)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let (mut state, mut log) = (None, String::new());
        for l in lines {
            let l = l.unwrap();
            log.push_str(&l);
            if let Some(f) = l.split("state in ").nth(1) {
                state = Some(f.to_string());
                break;
            }
        }
        let _ = child.kill();
        let _ = child.wait();
        (state.expect("no 'state in' line"), log)
    };
    let ((sa, log), (sb, _)) = (state_of(&a), state_of(&b));
    assert_ne!(sa, sb, "two config files share {sa}");
    assert_eq!(state_of(&a).0, sa, "the same file moved its state");
    for s in [&sa, &sb] {
        assert!(
            s.starts_with(&data.join("ringgate/a-").display().to_string()),
            "{s}"
        );
    }
    assert!(!log.contains("older ringgate"), "{log}");
    // state left in the old shared default: named, with the line that keeps using it
    std::fs::copy(&sa, data.join("ringgate/state.db")).unwrap();
    let (again, log) = state_of(&a);
    assert_eq!(again, sa);
    let shared = data.join("ringgate").display().to_string();
    assert!(
        log.contains("older ringgate") && log.contains(&format!("state_dir = \"{shared}\"")),
        "{log}"
    );
}

/// What `serve` says at start: no models (loudly), an unset provider key env var (its name
/// and the provider, never a key's value) — at 1 and 2 shards.
#[test]
fn serve_warns_about_no_models_and_unset_provider_keys() {
    let t = Tmp::new("warn");
    let empty = t.file("empty.toml", "[server]\nlisten = \"127.0.0.1:0\"\n");
    let keys = t.file("keys.toml", "[[provider]]\nname = \"up\"\nkind = \"openai\"\nbase_url = \"http://127.0.0.1:9/v1\"\napi_key_env = \"RG_CLI_UNSET_KEY_VAR\"\napi_keys = [{ env = \"RG_CLI_SET_KEY_VAR\" }]\n\n[[model]]\nname = \"m\"\nprovider = \"up\"\n");
    for shards in ["1", "2"] {
        let s = Served::start(&["--config", empty.to_str().unwrap(), "--shards", shards]);
        let log = s.early.join("\n");
        assert!(
            log.contains("warning: the config has no [[model]]"),
            "{log}"
        );
        assert_eq!(request(s.addr, &get("/healthz")).status, 200);
        drop(s);

        let mut child = Command::new(BIN)
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--shards",
                shards,
                "--config",
            ])
            .arg(&keys)
            .env_remove("RG_CLI_UNSET_KEY_VAR")
            .env("RG_CLI_SET_KEY_VAR", "sk-the-value-never-printed-42")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut log = String::new();
        for l in BufReader::new(child.stderr.take().unwrap()).lines() {
            let l = l.unwrap();
            log.push_str(&l);
            log.push('\n');
            if l.contains("listening on") {
                break;
            }
        }
        let _ = child.kill();
        let _ = child.wait();
        assert!(
            log.contains("warning: provider \"up\": env var RG_CLI_UNSET_KEY_VAR is not set"),
            "{log}"
        );
        assert!(!log.contains("sk-the-value-never-printed-42"), "{log}");
        assert!(!log.contains("no [[model]]"), "{log}");
    }
}

/// A refused `base_url` carrying a `?key=` secret: `check` and `serve` name the URL with the
/// secret masked.
#[test]
fn a_refused_base_url_never_prints_its_key() {
    let t = Tmp::new("keyurl");
    let secret = "AIzaSyS3cretValue0123456789";
    let path = t.file("g.toml", &format!(
        "[[provider]]\nname = \"g\"\nkind = \"gemini\"\nbase_url = \"https://generativelanguage.googleapis.com/v1beta?key={secret}&alt=sse\"\n\n[[model]]\nname = \"m\"\nprovider = \"g\"\n"
    ));
    let p = path.to_str().unwrap();
    for args in [
        vec!["check", "--config", p],
        vec!["serve", "--config", p, "--listen", "127.0.0.1:0"],
        vec!["doctor", "--config", p],
    ] {
        let (code, text) = run(&args, &[]);
        assert_eq!(code, Some(1), "{args:?}: {text}");
        assert!(!text.contains(secret), "{args:?} printed the key: {text}");
        assert!(text.contains("key=***"), "{args:?}: {text}");
    }
}
