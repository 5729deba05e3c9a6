//! TLS termination cost on the gateway's side, in memory (no sockets, no scheduler noise): the
//! server half of a full TLS 1.3 handshake (ECDSA P-256 certificate from rcgen, X25519, the
//! gateway's own `tls::server_config`), and per request on an established connection: decrypt
//! a 1 KiB request, encrypt a 1 KiB answer; encrypt one 200-byte SSE event. Only the server's
//! calls are timed (`iter_custom`); the client's work is excluded.
//!
//! `cargo bench --bench tls` (numbers: bench-results/tls.md).

use std::io::{Read, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use rustls::{ClientConnection, ServerConnection};

fn setup() -> (Arc<rustls::ServerConfig>, Arc<rustls::ClientConfig>) {
    let dir = std::env::temp_dir().join(format!("ringgate-bench-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    std::fs::write(dir.join("cert.pem"), cert.pem()).unwrap();
    std::fs::write(dir.join("key.pem"), key.serialize_pem()).unwrap();
    let server =
        ringgate::server::tls::server_config(&dir.join("cert.pem"), &dir.join("key.pem")).unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.der().clone()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut client = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    client.alpn_protocols = vec![b"http/1.1".to_vec()];
    // no resumption: every handshake is a full one
    client.resumption = rustls::client::Resumption::disabled();
    (server, Arc::new(client))
}

/// Move the client's pending records to the server (untimed).
fn to_server(c: &mut ClientConnection, s: &mut ServerConnection, wire: &mut Vec<u8>) -> Duration {
    wire.clear();
    while c.wants_write() {
        c.write_tls(wire).unwrap();
    }
    let t = Instant::now();
    let mut rd = &wire[..];
    while !rd.is_empty() {
        s.read_tls(&mut rd).unwrap();
    }
    s.process_new_packets().unwrap();
    t.elapsed()
}

/// Move the server's pending records to the client; returns the server's time.
fn to_client(s: &mut ServerConnection, c: &mut ClientConnection, wire: &mut Vec<u8>) -> Duration {
    wire.clear();
    let t = Instant::now();
    while s.wants_write() {
        s.write_tls(wire).unwrap();
    }
    let spent = t.elapsed();
    let mut rd = &wire[..];
    while !rd.is_empty() {
        c.read_tls(&mut rd).unwrap();
    }
    c.process_new_packets().unwrap();
    spent
}

/// A full handshake; returns the pair and the server's share of the time.
fn handshake(
    server: &Arc<rustls::ServerConfig>,
    client: &Arc<rustls::ClientConfig>,
    wire: &mut Vec<u8>,
) -> (ServerConnection, ClientConnection, Duration) {
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let mut c = ClientConnection::new(client.clone(), name).unwrap();
    let t = Instant::now();
    let mut s = ServerConnection::new(server.clone()).unwrap();
    let mut spent = t.elapsed();
    while c.is_handshaking() || s.is_handshaking() || s.wants_write() {
        spent += to_server(&mut c, &mut s, wire);
        spent += to_client(&mut s, &mut c, wire);
    }
    (s, c, spent)
}

fn tls(cr: &mut Criterion) {
    let (server, client) = setup();
    let mut g = cr.benchmark_group("tls");
    let mut wire = Vec::with_capacity(64 << 10);
    g.bench_function("server_handshake_tls13_p256", |b| {
        b.iter_custom(|n| {
            let mut total = Duration::ZERO;
            for _ in 0..n {
                total += handshake(&server, &client, &mut wire).2;
            }
            total
        })
    });
    let (mut s, mut c, _) = handshake(&server, &client, &mut wire);
    let request = vec![b'q'; 1024];
    let answer = vec![b'a'; 1024];
    let mut plain = vec![0u8; 4096];
    g.bench_function("server_request_1k_answer_1k", |b| {
        b.iter_custom(|n| {
            let mut total = Duration::ZERO;
            for _ in 0..n {
                c.writer().write_all(&request).unwrap();
                total += to_server(&mut c, &mut s, &mut wire);
                let t = Instant::now();
                let got = s.reader().read(&mut plain).unwrap();
                assert_eq!(got, request.len());
                s.writer().write_all(&answer).unwrap();
                total += t.elapsed();
                total += to_client(&mut s, &mut c, &mut wire);
                let _ = c.reader().read(&mut plain);
            }
            total
        })
    });
    let event = vec![b'e'; 200];
    g.bench_function("server_sse_event_200b", |b| {
        b.iter_custom(|n| {
            let mut total = Duration::ZERO;
            for _ in 0..n {
                let t = Instant::now();
                s.writer().write_all(&event).unwrap();
                total += t.elapsed();
                total += to_client(&mut s, &mut c, &mut wire);
                let _ = c.reader().read(&mut plain);
            }
            total
        })
    });
    g.finish();
}

criterion_group!(benches, tls);
criterion_main!(benches);
