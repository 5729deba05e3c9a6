//! What the cloud providers' per-request authorization costs on a shard (issue 28's hot-path
//! line): SigV4 signing of a Converse request (`upstream::bedrock::sigv4::sign`, and the whole
//! `Signer::authorize`: credential cell, clock, signature) and the Vertex token line
//! (`Tokens::authorize`: cell, one header line). Credentials are resolved off the shard and
//! are not part of it; here they come from the environment (AWS) and from a metadata server
//! on loopback that this binary serves (Google), resolved once before timing.
//!
//! Criterion-free: each case runs N times (default 200,000) after a warm-up, and prints
//! ns/request. `cloud_auth CASE N` runs one case only (for callgrind: the difference of two
//! runs' instruction counts over the difference of their N is instructions per request).
//! Cases: `sign-1k`, `sign-16k`, `sign-1k-session`, `bedrock-authorize`, `vertex-authorize`.
//!
//! Run: `cargo bench --bench cloud_auth` (numbers: docs/cloud.md, "Performance").

use std::future::Future;
use std::hint::black_box;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use ringgate::dialect::converse;
use ringgate::upstream::bedrock::{self, credentials, sigv4};
use ringgate::upstream::vertex;
use serde_json::json;

const HOST: &str = "bedrock-runtime.us-east-1.amazonaws.com";
const TARGET: &str = "/model/anthropic.claude-3-5-sonnet-20241022-v2%3A0/converse";

/// A Converse body of about `size` bytes: a system prompt and one user turn, translated from
/// the hub as the gateway does it.
fn body(size: usize) -> Vec<u8> {
    let words = "the quick brown fox jumps over the lazy dog ".repeat(size / 44 + 1);
    let chat = json!({"model": "m", "max_tokens": 256, "messages": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": &words[..size.saturating_sub(200).max(1)]}]});
    converse::chat_to_request(&chat).unwrap_or_default()
}

fn creds(session: bool) -> sigv4::Credentials {
    sigv4::Credentials {
        access_key_id: "AKIDEXAMPLE".into(),
        secret_access_key: "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY".into(),
        session_token: session.then(|| "IQoJb3JpZ2luX2VjEXAMPLE".repeat(30)),
        expires: None,
    }
}

/// Poll a future that is ready at once (the cells are resolved before timing).
fn ready<F: Future>(f: F) -> F::Output {
    let mut f = pin!(f);
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::yield_now();
    }
}

/// A metadata server on loopback answering every request with one token.
fn metadata_server() -> std::net::SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { return };
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            let body = r#"{"access_token":"ya29.bench-token-of-a-typical-length-0123456789abcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmnopqrstuvwxyz","expires_in":3600,"token_type":"Bearer"}"#;
            let _ = write!(
                s,
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    addr
}

fn wait_resolved<T: Send + Sync + 'static>(cell: &ringgate::upstream::cloud::Cell<T>) {
    let start = Instant::now();
    loop {
        match cell.peek() {
            Ok(Some(_)) => return,
            Err(e) => panic!("credentials: {e}"),
            Ok(None) if start.elapsed().as_secs() > 30 => panic!("credentials not resolved"),
            Ok(None) => std::thread::sleep(std::time::Duration::from_millis(10)),
        }
    }
}

fn time(n: u64, mut f: impl FnMut()) -> f64 {
    for _ in 0..n / 10 {
        f();
    }
    let t = Instant::now();
    for _ in 0..n {
        f();
    }
    t.elapsed().as_nanos() as f64 / n as f64
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let only = args.first().cloned();
    let n: u64 = args.get(1).and_then(|v| v.parse().ok()).unwrap_or(200_000);
    let on = |c: &str| only.as_deref().is_none_or(|o| o == c);
    let date = sigv4::amz_date(1_764_633_600);
    let (b1, b16) = (body(1024), body(16 * 1024));
    let (c, cs) = (creds(false), creds(true));
    let mut rows = Vec::new();

    let sign = |cr: &sigv4::Credentials, b: &[u8]| {
        black_box(sigv4::sign(
            black_box(cr),
            &sigv4::Request {
                region: "us-east-1",
                service: bedrock::SERVICE,
                host: HOST,
                target: TARGET,
                body: black_box(b),
                amz_date: &date,
            },
        ));
    };
    if on("sign-1k") {
        rows.push(("sign-1k", b1.len(), time(n, || sign(&c, &b1))));
    }
    if on("sign-16k") {
        rows.push(("sign-16k", b16.len(), time(n, || sign(&c, &b16))));
    }
    if on("sign-1k-session") {
        rows.push(("sign-1k-session", b1.len(), time(n, || sign(&cs, &b1))));
    }
    if on("bedrock-authorize") {
        std::env::set_var("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE");
        std::env::set_var(
            "AWS_SECRET_ACCESS_KEY",
            "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
        );
        std::env::set_var("AWS_EC2_METADATA_DISABLED", "true");
        let src = credentials::Source {
            region: "us-east-1".into(),
            role_arn: None,
            sts_url: "http://127.0.0.1:9".into(),
        };
        let signer = bedrock::Signer::new("bench", src);
        wait_resolved(&signer.cell);
        let mut out = Vec::with_capacity(1024);
        let ns = time(n, || {
            out.clear();
            let r = ready(signer.authorize(HOST, TARGET, black_box(&b1), &mut out));
            assert!(r.is_ok());
            black_box(&out);
        });
        rows.push(("bedrock-authorize", b1.len(), ns));
    }
    if on("vertex-authorize") {
        std::env::set_var("GCE_METADATA_HOST", metadata_server().to_string());
        std::env::remove_var("GOOGLE_APPLICATION_CREDENTIALS");
        let src = vertex::Source {
            credentials_file: None,
            token_url: None,
        };
        let tokens = vertex::Tokens::new("bench", src);
        wait_resolved(&tokens.cell);
        let mut out = Vec::with_capacity(1024);
        let ns = time(n, || {
            out.clear();
            let r = ready(tokens.authorize(&mut out));
            assert!(r.is_ok());
            black_box(&out);
        });
        rows.push(("vertex-authorize", 0, ns));
    }
    println!("| case | body bytes | ns/request |\n|---|---|---|");
    for (case, bytes, ns) in rows {
        println!("| {case} | {bytes} | {ns:.0} |");
    }
}
