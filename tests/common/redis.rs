//! The shared-store tests' parts (`redis_limits`, `redis_fleet`, `fleet_keys`): real
//! `redis-server` processes (plain, a `requirepass` password, TLS with a test CA made by rcgen,
//! an ACL user, Cluster nodes) on free ports in temp dirs, and real gateway processes (the
//! binary) with their stderr kept for assertions. Everything started here is killed on drop.
//! Include it next to `common` (it uses `crate::common::metric`).
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

pub fn temp_dir(tag: &str) -> PathBuf {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let d = std::env::temp_dir().join(format!("rg-fleet-{tag}-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A test CA and a server certificate it signed for `names` (in `dir`: ca.pem, cert.pem,
/// key.pem), plus a second CA that signed nothing here (other-ca.pem).
pub fn test_ca(dir: &Path, names: &[&str]) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "ringgate fleet test CA");
    let ca = ca_params.clone().self_signed(&ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let params =
        rcgen::CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
            .unwrap();
    let cert = params.signed_by(&key, &ca, &ca_key).unwrap();
    std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
    std::fs::write(dir.join("cert.pem"), cert.pem()).unwrap();
    std::fs::write(dir.join("key.pem"), key.serialize_pem()).unwrap();
    let other_key = rcgen::KeyPair::generate().unwrap();
    let other = ca_params.self_signed(&other_key).unwrap();
    std::fs::write(dir.join("other-ca.pem"), other.pem()).unwrap();
}

/// How a test server is set up.
#[derive(Default, Clone)]
pub struct RedisOpts {
    /// TLS only (no plain port), with a certificate for these names.
    pub tls_names: Option<Vec<&'static str>>,
    /// An ACL user `(name, password)`; the default user is switched off.
    pub acl: Option<(&'static str, &'static str)>,
    /// `--cluster-enabled yes`.
    pub cluster: bool,
    /// `--requirepass` (the default user's password).
    pub password: Option<&'static str>,
}

/// A `redis-server` on a free port; killed on drop.
pub struct Redis {
    pub port: u16,
    pub dir: PathBuf,
    opts: RedisOpts,
    child: Option<Child>,
}

impl Redis {
    pub fn start(opts: RedisOpts) -> Redis {
        let dir = temp_dir("redis");
        if let Some(names) = &opts.tls_names {
            test_ca(&dir, names);
        }
        let mut r = Redis {
            port: free_port(),
            dir,
            opts,
            child: None,
        };
        r.restart();
        r
    }

    /// Start (again) on the same port.
    pub fn restart(&mut self) {
        let mut cmd = Command::new("redis-server");
        let port = self.port.to_string();
        cmd.args(["--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .args(["--loglevel", "warning", "--dir"])
            .arg(&self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if self.opts.tls_names.is_some() {
            cmd.args(["--port", "0", "--tls-port", &port])
                .arg("--tls-cert-file")
                .arg(self.dir.join("cert.pem"))
                .arg("--tls-key-file")
                .arg(self.dir.join("key.pem"))
                .arg("--tls-ca-cert-file")
                .arg(self.dir.join("ca.pem"))
                .args(["--tls-auth-clients", "no"]);
        } else {
            cmd.args(["--port", &port]);
        }
        if let Some((user, pass)) = self.opts.acl {
            cmd.args(["--user", "default", "off"]);
            cmd.args([
                "--user",
                user,
                "on",
                &format!(">{pass}"),
                "~*",
                "&*",
                "+@all",
            ]);
        }
        if let Some(p) = self.opts.password {
            cmd.args(["--requirepass", p]);
        }
        if self.opts.cluster {
            // the bus port given explicitly (port + 10000 may not exist or be taken)
            cmd.args(["--cluster-enabled", "yes", "--cluster-port"])
                .arg(free_port().to_string())
                .arg("--cluster-config-file")
                .arg(self.dir.join("nodes.conf"));
        }
        let child = cmd.spawn().unwrap_or_else(|e| {
            panic!("cannot start redis-server ({e}): apt-get install -y redis-server")
        });
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                if self.opts.tls_names.is_some() {
                    // TLS: a TCP accept is as far as a plain client can see
                    return;
                }
                if let Ok(r) = self.try_cmd(&["PING"]) {
                    if r.starts_with("PONG") {
                        return;
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("redis-server did not come up on port {}", self.port);
    }

    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// One command on a fresh plain connection (AUTH as the ACL user when there is one).
    pub fn try_cmd(&self, args: &[&str]) -> std::io::Result<String> {
        let mut s = TcpStream::connect(("127.0.0.1", self.port))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        if let Some((user, pass)) = self.opts.acl {
            resp(&mut s, &["AUTH", user, pass])?;
        }
        if let Some(p) = self.opts.password {
            resp(&mut s, &["AUTH", p])?;
        }
        resp(&mut s, args)
    }

    /// One command in database `db` (after `SELECT`).
    pub fn cmd_db(&self, db: u32, args: &[&str]) -> String {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        if let Some(p) = self.opts.password {
            assert_eq!(resp(&mut s, &["AUTH", p]).unwrap(), "OK");
        }
        assert_eq!(resp(&mut s, &["SELECT", &db.to_string()]).unwrap(), "OK");
        resp(&mut s, args).unwrap()
    }

    /// `redis://[:password@]127.0.0.1:<port>/<db>` (plain servers).
    pub fn url(&self, db: u32) -> String {
        match self.opts.password {
            Some(p) => format!("redis://:{p}@127.0.0.1:{}/{db}", self.port),
            None => format!("redis://127.0.0.1:{}/{db}", self.port),
        }
    }

    pub fn cmd(&self, args: &[&str]) -> String {
        self.try_cmd(args).unwrap()
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Send one command, read one reply (status, error, integer, bulk; an array as its elements
/// joined by newlines, nested arrays flattened).
pub fn resp(s: &mut TcpStream, args: &[&str]) -> std::io::Result<String> {
    let mut out = format!("*{}\r\n", args.len());
    for a in args {
        out.push_str(&format!("${}\r\n{a}\r\n", a.len()));
    }
    s.write_all(out.as_bytes())?;
    let mut r = BufReader::new(s);
    let mut lines = Vec::new();
    read_reply(&mut r, &mut lines)?;
    Ok(lines.join("\n"))
}

fn read_reply(r: &mut impl BufRead, into: &mut Vec<String>) -> std::io::Result<()> {
    let mut line = String::new();
    r.read_line(&mut line)?;
    let line = line.trim_end().to_string();
    if line.is_empty() {
        return Err(std::io::Error::other("connection closed"));
    }
    match line.split_at(1) {
        ("$", n) if n != "-1" => {
            let mut body = vec![0u8; n.parse::<usize>().unwrap() + 2];
            r.read_exact(&mut body)?;
            into.push(String::from_utf8_lossy(&body[..body.len() - 2]).into_owned());
        }
        ("$", _) => into.push("(nil)".into()),
        ("*", n) if n != "-1" => {
            for _ in 0..n.parse::<usize>().unwrap() {
                read_reply(r, into)?;
            }
        }
        (_, rest) => into.push(rest.to_string()),
    }
    Ok(())
}

/// A gateway process (the real binary) with its stderr kept for assertions; killed on drop.
pub struct Gateway {
    pub addr: SocketAddr,
    child: Child,
    log: Arc<Mutex<String>>,
    dir: PathBuf,
}

impl Gateway {
    pub fn start(config: &str) -> Gateway {
        Gateway::start_env(config, &[])
    }

    pub fn start_env(config: &str, env: &[(&str, &str)]) -> Gateway {
        let dir = temp_dir("gw");
        let path = dir.join("ringgate.toml");
        std::fs::write(&path, config).unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_ringgate"));
        cmd.arg("--config")
            .arg(&path)
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let err = child.stderr.take().unwrap();
        let sink = log.clone();
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            for line in BufReader::new(err).lines() {
                let Ok(line) = line else { return };
                if let Some(rest) = line.split("listening on http://").nth(1) {
                    if let Some(tx) = tx.take() {
                        let _ = tx.send(rest.split_whitespace().next().unwrap_or("").to_string());
                    }
                }
                let mut l = sink.lock().unwrap();
                l.push_str(&line);
                l.push('\n');
            }
        });
        let addr = match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(a) => a.parse().unwrap(),
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("gateway did not start: {}", log.lock().unwrap());
            }
        };
        Gateway {
            addr,
            child,
            log,
            dir,
        }
    }

    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// The admin listener's address (from its start-up line).
    pub fn admin(&self) -> SocketAddr {
        let l = self.wait_log("admin listening on http://");
        let rest = l.split("admin listening on http://").nth(1).unwrap();
        rest.split_whitespace().next().unwrap().parse().unwrap()
    }

    pub fn metric(&self, name: &str) -> u64 {
        crate::common::metric(self.addr, name)
    }

    /// Poll `/metrics` until `name` sums to `want` (generous deadline: the box is loaded).
    pub fn wait_metric(&self, name: &str, want: u64) {
        self.wait_metric_by(name, |v| v == want, &format!("{want}"));
    }

    pub fn wait_metric_by(&self, name: &str, ok: impl Fn(u64) -> bool, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut last = 0;
        while Instant::now() < deadline {
            last = self.metric(name);
            if ok(last) {
                return;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        panic!("{name} = {last}, want {what}\n{}", self.log());
    }

    /// Poll the log until it contains `needle`.
    pub fn wait_log(&self, needle: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            let l = self.log();
            if l.contains(needle) {
                return l;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        panic!("no {needle:?} in the log:\n{}", self.log());
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Three `redis-server --cluster-enabled yes` masters joined by `redis-cli --cluster create`
/// (no replicas), every slot served.
pub struct RedisCluster {
    pub nodes: Vec<Redis>,
}

impl RedisCluster {
    pub fn start() -> RedisCluster {
        let nodes: Vec<Redis> = (0..3)
            .map(|_| {
                Redis::start(RedisOpts {
                    cluster: true,
                    ..Default::default()
                })
            })
            .collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .expect("redis-cli (apt-get install -y redis-tools)");
        assert!(
            out.status.success(),
            "redis-cli --cluster create: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let c = RedisCluster { nodes };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ok = c.nodes.iter().all(|n| {
                n.try_cmd(&["CLUSTER", "INFO"])
                    .is_ok_and(|i| i.contains("cluster_state:ok"))
            });
            if ok {
                return c;
            }
            assert!(Instant::now() < deadline, "the cluster did not become ok");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The node serving `slot` (index into `nodes`).
    pub fn owner(&self, slot: u16) -> usize {
        let my_ids: Vec<String> = self
            .nodes
            .iter()
            .map(|n| n.cmd(&["CLUSTER", "MYID"]))
            .collect();
        let view = self.nodes[0].cmd(&["CLUSTER", "NODES"]);
        for line in view.lines() {
            let f: Vec<&str> = line.split(' ').collect();
            let serves = f.iter().skip(8).any(|r| match r.split_once('-') {
                Some((a, b)) => {
                    a.parse::<u16>().is_ok_and(|a| a <= slot)
                        && b.parse::<u16>().is_ok_and(|b| slot <= b)
                }
                None => r.parse::<u16>() == Ok(slot),
            });
            if serves {
                return my_ids.iter().position(|id| id == f[0]).unwrap();
            }
        }
        panic!("nobody serves slot {slot}: {view}");
    }

    /// Hand the (empty) `slot` to node `to`: every node is told at once.
    pub fn move_slot(&self, slot: u16, to: usize) {
        let id = self.nodes[to].cmd(&["CLUSTER", "MYID"]);
        for n in &self.nodes {
            let r = n.cmd(&["CLUSTER", "SETSLOT", &slot.to_string(), "NODE", &id]);
            assert_eq!(r, "OK", "SETSLOT on {}", n.port);
        }
    }
}
