//! TLS to the upstream: rustls with SNI/IP verification against a test CA given by `ca_file`,
//! a pooled TLS connection reused, and an untrusted certificate refused with a 502.

#[path = "../common/mod.rs"]
mod common;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::Arc;

use common::*;
use ringgate::config::Config;

/// A tiny blocking HTTPS upstream answering every request with a fixed chat completion.
fn tls_upstream() -> (std::net::SocketAddr, String) {
    let key = rcgen::KeyPair::generate().unwrap();
    let params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
    let cert = params.self_signed(&key).unwrap();
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("ringgate-tls-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ca = dir.join("ca.pem");
    std::fs::write(&ca, cert.pem()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        )
        .unwrap();
    let cfg = Arc::new(cfg);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let cfg = cfg.clone();
            std::thread::spawn(move || {
                let Ok(conn) = rustls::ServerConnection::new(cfg) else {
                    return;
                };
                let mut tls = rustls::StreamOwned::new(conn, stream);
                let mut buf = Vec::new();
                let mut tmp = [0u8; 4096];
                loop {
                    // one request per loop: head + Content-Length body
                    let (head_end, cl) = loop {
                        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            let head = String::from_utf8_lossy(&buf[..i]).to_ascii_lowercase();
                            let cl = head
                                .lines()
                                .find_map(|l| l.strip_prefix("content-length: "))
                                .and_then(|v| v.trim().parse::<usize>().ok())
                                .unwrap_or(0);
                            break (i + 4, cl);
                        }
                        match tls.read(&mut tmp) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&tmp[..n]),
                        }
                    };
                    while buf.len() < head_end + cl {
                        match tls.read(&mut tmp) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&tmp[..n]),
                        }
                    }
                    buf.drain(..head_end + cl);
                    let body = br#"{"id":"x","object":"chat.completion","model":"tls-model","choices":[{"index":0,"message":{"role":"assistant","content":"over tls"},"finish_reason":"stop"}]}"#;
                    let resp = format!("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n", body.len());
                    if tls
                        .write_all(resp.as_bytes())
                        .and_then(|_| tls.write_all(body))
                        .and_then(|_| tls.flush())
                        .is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    (addr, ca.to_string_lossy().into_owned())
}

fn gateway(
    upstream: std::net::SocketAddr,
    ca: Option<&str>,
    v: Variant,
) -> ringgate::server::Running {
    let Variant { driver, shards } = v;
    let ca_line = ca
        .map(|c| format!("ca_file = \"{c}\"\n"))
        .unwrap_or_default();
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nshards = {shards}\npin = false\ndriver = \"{driver}\"\n\n\
         [[provider]]\nname = \"tls\"\nkind = \"openai\"\nbase_url = \"https://{upstream}/v1\"\n{ca_line}\n\
         [[model]]\nname = \"m\"\nprovider = \"tls\"\n"
    );
    ringgate::server::start(Config::parse(&text).unwrap()).unwrap()
}

#[test]
fn https_upstream_with_a_trusted_ca() {
    let (up, ca) = tls_upstream();
    for d in variants() {
        let gw = gateway(up, Some(&ca), d);
        for _ in 0..3 {
            let r = request(
                gw.addr,
                &post("/v1/chat/completions", r#"{"model":"m","messages":[]}"#),
            );
            assert_eq!(r.status, 200, "{d}: {}", r.text());
            assert_eq!(r.json()["choices"][0]["message"]["content"], "over tls");
        }
        wait_metric(
            gw.addr,
            "ringgate_upstream_idle_connections",
            1,
            &format!("{d}: the TLS connection is pooled and reused"),
        );
        gw.stop();
    }
}

#[test]
fn untrusted_upstream_certificate_is_a_502() {
    one_driver("io_uring").for_each(untrusted_upstream_certificate_is_a_502_at);
}

fn untrusted_upstream_certificate_is_a_502_at(v: Variant) {
    let (up, _ca) = tls_upstream();
    let gw = gateway(up, None, v);
    let r = request(
        gw.addr,
        &post("/v1/chat/completions", r#"{"model":"m","messages":[]}"#),
    );
    assert_eq!(r.status, 502, "{}", r.text());
    // The handshake detail (names, certificate errors) stays in the gateway's log; the client
    // gets the generic upstream error with a request id.
    assert_eq!(r.json()["error"]["code"], "upstream_connect_error");
    let id = r.header("x-request-id").expect("x-request-id").to_string();
    assert!(r.json()["error"]["message"].as_str().unwrap().contains(&id));
    gw.stop();
}
