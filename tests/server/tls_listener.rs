//! TLS termination on the client side (`server.tls_listen`): a test CA (rcgen) issues the
//! gateway's certificate; a rustls client trusting only that CA talks to the TLS listener
//! (ALPN http/1.1, keep-alive, stream and non-stream) while the plain listener serves too;
//! plain HTTP to the TLS port is refused with a 400; a silent or stalled handshake is cut at
//! the deadline; the connection cap covers TLS connections; bad certificate files stop the
//! start with the path named; a non-loopback tls_listen needs keys. Both drivers.

#[path = "../common/mod.rs"]
mod common;

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use ringgate::config::Config;
use ringgate::mock::Profile;
use ringgate::server::{self, Running};

const CHAT: &str = r#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}"#;
const STREAM: &str =
    r#"{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;

/// A temp dir with a test CA (`ca.pem`) and a server certificate for 127.0.0.1 / localhost
/// signed by it (`cert.pem`, `key.pem`); also `other-key.pem`, a key of another certificate.
fn test_pki() -> PathBuf {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "ringgate-tls-listener-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "ringgate test CA");
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let params =
        rcgen::CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
            .unwrap();
    let cert = params.signed_by(&key, &ca, &ca_key).unwrap();
    std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
    std::fs::write(dir.join("cert.pem"), cert.pem()).unwrap();
    std::fs::write(dir.join("key.pem"), key.serialize_pem()).unwrap();
    let other = rcgen::KeyPair::generate().unwrap();
    std::fs::write(dir.join("other-key.pem"), other.serialize_pem()).unwrap();
    dir
}

/// The config file in `dir` (relative cert paths), loaded the way `ringgate` loads it.
fn gateway_in(dir: &Path, v: Variant, upstream: SocketAddr, server_extra: &str) -> Running {
    let Variant { driver, shards } = v;
    let text = format!(
        r#"
[server]
listen = "127.0.0.1:0"
tls_listen = "127.0.0.1:0"
tls_cert = "cert.pem"
tls_key = "key.pem"
shards = {shards}
pin = false
driver = "{driver}"
{server_extra}

[[provider]]
name = "local"
kind = "openai"
base_url = "http://{upstream}/v1"

[[model]]
name = "gpt-4o-mini"
provider = "local"
"#
    );
    let path = dir.join("ringgate.toml");
    std::fs::write(&path, text).unwrap();
    let cfg = Config::load(path.to_str().unwrap()).unwrap();
    server::start(cfg).unwrap()
}

fn client_config(dir: &Path) -> Arc<rustls::ClientConfig> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls::pki_types::CertificateDer::pem_file_iter(dir.join("ca.pem")).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(cfg)
}

type Tls = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

fn tls_connect(cfg: &Arc<rustls::ClientConfig>, addr: SocketAddr) -> Tls {
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let conn = rustls::ClientConnection::new(cfg.clone(), name).unwrap();
    let mut tls = rustls::StreamOwned::new(conn, connect(addr));
    while tls.conn.is_handshaking() {
        tls.conn.complete_io(&mut tls.sock).unwrap();
    }
    tls
}

#[test]
fn sdk_style_client_over_tls_with_a_test_ca_while_plain_serves() {
    let dir = test_pki();
    let cfg = client_config(&dir);
    for driver in variants() {
        let mock = start_mock(Profile::Instant, driver);
        let gw = gateway_in(&dir, driver, mock.addr, "");
        let tls_addr = gw.tls_addr.expect("tls listener");
        assert_ne!(tls_addr, gw.addr);
        let mut tls = tls_connect(&cfg, tls_addr);
        assert_eq!(tls.conn.alpn_protocol(), Some(&b"http/1.1"[..]), "{driver}");
        let mut buf = Vec::new();
        // several requests on one kept-alive TLS connection, non-stream and stream
        for i in 0..4 {
            let body = if i % 2 == 0 { CHAT } else { STREAM };
            tls.write_all(&post("/v1/chat/completions", body)).unwrap();
            tls.flush().unwrap();
            let r = read_response(&mut tls, &mut buf).expect("answer over TLS");
            assert_eq!(r.status, 200, "{driver}: {}", r.text());
            if i % 2 == 0 {
                assert_eq!(r.json()["object"], "chat.completion");
            } else {
                let (content, _, done) = sse_content(&r.body);
                assert!(done && !content.is_empty(), "{driver}: {}", r.text());
            }
        }
        // the plain listener serves at the same time
        let r = request(gw.addr, &post("/v1/chat/completions", CHAT));
        assert_eq!(r.status, 200, "{driver}");
        wait_metric(
            gw.addr,
            "ringgate_tls_handshakes_total",
            1,
            &format!("{driver}"),
        );
        drop(tls);
        gw.stop();
        mock.stop();
    }
}

#[test]
fn a_replaced_certificate_serves_new_connections_while_open_ones_keep_theirs() {
    one_driver("epoll")
        .for_each(a_replaced_certificate_serves_new_connections_while_open_ones_keep_theirs_at);
}

fn a_replaced_certificate_serves_new_connections_while_open_ones_keep_theirs_at(v: Variant) {
    let (first, second) = (test_pki(), test_pki());
    let (cfg1, cfg2) = (client_config(&first), client_config(&second));
    let mock = start_mock(Profile::Instant, v);
    let gw = gateway_in(&first, v, mock.addr, "");
    let tls_addr = gw.tls_addr.unwrap();
    let mut open = tls_connect(&cfg1, tls_addr);
    // what a reload does: build a new configuration from the files, swap it in
    let certs = gw.tls_certs.clone().unwrap();
    let new =
        ringgate::server::tls::server_config(&second.join("cert.pem"), &second.join("key.pem"))
            .unwrap();
    certs.replace(new);
    let mut fresh = tls_connect(&cfg2, tls_addr);
    for s in [&mut open, &mut fresh] {
        s.write_all(&post("/v1/chat/completions", CHAT)).unwrap();
        let r = read_response(s, &mut Vec::new()).unwrap();
        assert_eq!(r.status, 200);
    }
    // a client trusting only the first CA is refused now
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let conn = rustls::ClientConnection::new(cfg1.clone(), name).unwrap();
    let mut old = rustls::StreamOwned::new(conn, connect(tls_addr));
    let mut err = None;
    while old.conn.is_handshaking() {
        if let Err(e) = old.conn.complete_io(&mut old.sock) {
            err = Some(e);
            break;
        }
    }
    assert!(err.is_some(), "the old certificate is no longer served");
    // and TlsCerts::reload re-reads the files it was loaded from (the first pair here)
    certs.reload().unwrap();
    let mut again = tls_connect(&cfg1, tls_addr);
    again.write_all(&get("/healthz")).unwrap();
    assert_eq!(
        read_response(&mut again, &mut Vec::new()).unwrap().status,
        200
    );
    gw.stop();
    mock.stop();
}

#[test]
fn plain_http_to_the_tls_port_is_refused_cleanly_and_tls_keeps_serving() {
    let dir = test_pki();
    let cfg = client_config(&dir);
    for driver in variants() {
        let mock = start_mock(Profile::Instant, driver);
        let gw = gateway_in(&dir, driver, mock.addr, "");
        let tls_addr = gw.tls_addr.unwrap();
        let r = request(tls_addr, &post("/v1/chat/completions", CHAT));
        assert_eq!(r.status, 400, "{driver}: {}", r.text());
        assert!(r.text().contains("https://"), "{}", r.text());
        assert_eq!(r.header("connection"), Some("close"));
        // garbage that is neither TLS nor HTTP: the handshake fails, the connection closes
        let mut s = connect(tls_addr);
        s.write_all(b"\x00\x01\x02garbage\r\n\r\n").unwrap();
        assert!(is_closed(&mut s), "{driver}");
        // TLS still works
        let mut tls = tls_connect(&cfg, tls_addr);
        tls.write_all(&post("/v1/chat/completions", CHAT)).unwrap();
        let r = read_response(&mut tls, &mut Vec::new()).unwrap();
        assert_eq!(r.status, 200, "{driver}");
        wait_metric(
            gw.addr,
            "ringgate_tls_handshake_failures_total{reason=\"plain_http\"}",
            1,
            "counted",
        );
        gw.stop();
        mock.stop();
    }
}

#[test]
fn stalled_handshakes_are_cut_at_the_deadline() {
    let dir = test_pki();
    for driver in variants() {
        let mock = start_mock(Profile::Instant, driver);
        let gw = gateway_in(&dir, driver, mock.addr, "tls_handshake_timeout_ms = 300");
        let tls_addr = gw.tls_addr.unwrap();
        // one says nothing, one sends the first bytes of a ClientHello and stops
        let mut silent = connect(tls_addr);
        let mut partial = connect(tls_addr);
        partial
            .write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01])
            .unwrap();
        let t = Instant::now();
        assert!(is_closed(&mut silent), "{driver}");
        assert!(is_closed(&mut partial), "{driver}");
        let took = t.elapsed();
        assert!(
            took >= Duration::from_millis(250) && took < Duration::from_secs(2),
            "{driver}: {took:?}"
        );
        // (the scrape's own connection is the one left open)
        wait_metric(
            gw.addr,
            "ringgate_connections_open",
            1,
            "handshakes released",
        );
        wait_metric(
            gw.addr,
            "ringgate_tls_handshake_failures_total{reason=\"timeout\"}",
            2,
            "counted",
        );
        gw.stop();
        mock.stop();
    }
}

#[test]
fn the_connection_cap_covers_tls_connections() {
    let dir = test_pki();
    let cfg = client_config(&dir);
    for driver in variants() {
        let mock = start_mock(Profile::Instant, driver);
        let gw = gateway_in(&dir, driver, mock.addr, "max_connections = 1");
        let tls_addr = gw.tls_addr.unwrap();
        // a handshaking connection already counts: the plain listener is over the cap now.
        // (The count is the process's: a plain probe still open on the gateway's side when
        // the TLS connection is accepted holds the one place, and that TLS connection is then
        // one over the cap; so a connection that did not get the place is replaced.)
        let t = Instant::now();
        let _held = loop {
            let held = connect(tls_addr);
            std::thread::sleep(Duration::from_millis(100));
            if request(gw.addr, &post("/v1/chat/completions", CHAT)).status == 503 {
                break held;
            }
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "{driver}: cap not reached"
            );
        };
        // over the cap: health answered, API refused (both over TLS)
        let mut probe = tls_connect(&cfg, tls_addr);
        probe.write_all(&get("/healthz")).unwrap();
        let r = read_response(&mut probe, &mut Vec::new()).unwrap();
        assert_eq!(r.status, 200, "{driver}");
        let mut over = tls_connect(&cfg, tls_addr);
        over.write_all(&post("/v1/chat/completions", CHAT)).unwrap();
        let r = read_response(&mut over, &mut Vec::new()).unwrap();
        assert_eq!(r.status, 503, "{driver}: {}", r.text());
        gw.stop();
        mock.stop();
    }
}

#[test]
fn bad_certificate_files_stop_the_start_with_the_path() {
    let dir = test_pki();
    std::fs::write(dir.join("not-pem.pem"), "hello\n").unwrap();
    let cases = [
        ("missing.pem", "key.pem", "missing.pem: cannot read"),
        ("not-pem.pem", "key.pem", "not-pem.pem: no PEM certificate"),
        ("cert.pem", "not-pem.pem", "not-pem.pem: no PEM private key"),
        (
            "cert.pem",
            "other-key.pem",
            "the private key does not belong to the certificate",
        ),
    ];
    for (cert, key, want) in cases {
        let text = format!(
            "[server]\nlisten = \"127.0.0.1:0\"\ntls_listen = \"127.0.0.1:0\"\ntls_cert = \"{cert}\"\ntls_key = \"{key}\"\nshards = 1\n"
        );
        let path = dir.join("bad.toml");
        std::fs::write(&path, &text).unwrap();
        let cfg = Config::load(path.to_str().unwrap()).unwrap();
        let e = server::start(cfg).err().expect("refused").to_string();
        assert!(e.contains(want), "{cert}/{key}: {e}");
        assert!(e.contains(&dir.display().to_string()), "path named: {e}");
        // the binary: exit 1, the reason on stderr
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_ringgate"))
            .args(["serve", "--config", path.to_str().unwrap()])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{cert}/{key}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(want), "{stderr}");
        // `ringgate check` loads them too
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_ringgate"))
            .args(["check", "--config", path.to_str().unwrap()])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "check {cert}/{key}");
        assert!(String::from_utf8_lossy(&out.stderr).contains(want));
    }
}

#[test]
fn a_public_tls_listener_needs_keys() {
    let dir = test_pki();
    let text = "[server]\nlisten = \"127.0.0.1:0\"\ntls_listen = \"0.0.0.0:0\"\ntls_cert = \"cert.pem\"\ntls_key = \"key.pem\"\nshards = 1\n";
    let path = dir.join("public.toml");
    std::fs::write(&path, text).unwrap();
    let cfg = Config::load(path.to_str().unwrap()).unwrap();
    let e = server::start(cfg).err().expect("refused").to_string();
    assert!(e.contains("0.0.0.0:0") && e.contains("without keys"), "{e}");
}

#[test]
fn tls_settings_are_validated() {
    for (text, want) in [
        (
            "[server]\ntls_listen = \"127.0.0.1:8443\"\n",
            "needs tls_cert and tls_key",
        ),
        (
            "[server]\ntls_cert = \"c.pem\"\ntls_key = \"k.pem\"\n",
            "tls_listen is not",
        ),
        (
            "[server]\ntls_listen = \"nope\"\ntls_cert = \"c\"\ntls_key = \"k\"\n",
            "tls_listen \"nope\"",
        ),
    ] {
        let errs = Config::parse(text).unwrap_err();
        assert!(
            errs.iter()
                .any(|e| e.message.contains(want) && e.line == Some(2)),
            "{text}: {errs:?}"
        );
    }
    // unchanged: absolute paths stay as written
    let dir = test_pki();
    let abs = dir.join("cert.pem");
    let text = format!(
        "[server]\ntls_listen = \"127.0.0.1:0\"\ntls_cert = \"{}\"\ntls_key = \"key.pem\"\n",
        abs.display()
    );
    let path = dir.join("abs.toml");
    std::fs::write(&path, text).unwrap();
    let cfg = Config::load(path.to_str().unwrap()).unwrap();
    assert_eq!(
        cfg.server.tls_cert.as_ref().unwrap().get_ref(),
        &abs.display().to_string()
    );
    assert_eq!(
        cfg.server.tls_key.as_ref().unwrap().get_ref(),
        &dir.join("key.pem").display().to_string()
    );
}
