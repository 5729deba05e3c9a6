//! `ringgate doctor`: the report and its exit code, with providers that answer (the mock), that
//! cannot be reached, that speak TLS with a private CA and refuse the key, and a broken config.

#[path = "../common/mod.rs"]
mod common;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::process::Command;
use std::sync::Arc;

use common::*;
use ringgate::mock::Profile;

const BIN: &str = env!("CARGO_BIN_EXE_ringgate");

fn temp_dir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("ringgate-doctor-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Run `ringgate doctor --config` on `text`; (exit code, stdout).
fn doctor(tag: &str, text: &str, env: &[(&str, &str)]) -> (i32, String) {
    let dir = temp_dir(tag);
    let path = dir.join("ringgate.toml");
    std::fs::write(&path, text).unwrap();
    let out = Command::new(BIN)
        .args(["doctor", "--config", path.to_str().unwrap()])
        .envs(env.iter().copied())
        .env_remove("RINGGATE_CONFIG")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    (out.status.code().unwrap_or(-1), stdout)
}

#[test]
fn a_box_with_a_reachable_provider_is_ready() {
    let mock = start_mock(Profile::Instant, "epoll");
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nshards = 1\n\n[[provider]]\nname = \"local\"\nkind = \"openai\"\nbase_url = \"http://{}/v1\"\napi_key_env = \"DOCTOR_TEST_KEY\"\n\n[[model]]\nname = \"gpt-4o-mini\"\nprovider = \"local\"\n",
        mock.addr
    );
    let secret = "sk-doctor-secret-value-123";
    let (code, out) = doctor("ok", &text, &[("DOCTOR_TEST_KEY", secret)]);
    assert_eq!(code, 0, "{out}");
    for want in [
        "kernel ",
        "driver: ",
        "open files: ",
        "locked memory: ",
        "memory: ",
        "cpus: ",
        "sysctl (against tuning/sysctl.conf)",
        "valid: 1 provider(s), 1 model(s)",
        &format!("local (http://{}/v1): TCP {}", mock.addr, mock.addr),
        "GET /v1/models 200",
        "key from DOCTOR_TEST_KEY",
        "ready: 0 problem(s)",
    ] {
        assert!(out.contains(want), "missing {want:?} in:\n{out}");
    }
    assert!(
        !out.contains(secret),
        "the key must never be printed:\n{out}"
    );
    mock.stop();
}

#[test]
fn an_unreachable_provider_fails_with_the_problem_named() {
    // a port nothing listens on
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let text = format!(
        "[[provider]]\nname = \"down\"\nkind = \"openai\"\nbase_url = \"http://127.0.0.1:{port}/v1\"\n\n\
         [[provider]]\nname = \"nameless\"\nkind = \"anthropic\"\nbase_url = \"http://ringgate-doctor.invalid\"\n\n\
         [[model]]\nname = \"m\"\nprovider = \"down\"\n"
    );
    let (code, out) = doctor("down", &text, &[]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(&format!(
            "FAIL  down (http://127.0.0.1:{port}/v1): TCP connect to 127.0.0.1:{port}"
        )),
        "{out}"
    );
    assert!(
        out.contains(
            "FAIL  nameless (http://ringgate-doctor.invalid): DNS ringgate-doctor.invalid"
        ),
        "{out}"
    );
    assert!(out.contains("fix: "), "{out}");
    assert!(out.contains("NOT ready: 2 problem(s)"), "{out}");
}

/// A TLS upstream (self-signed for 127.0.0.1) that answers every request with 401.
fn tls_refusing_upstream(dir: &std::path::Path) -> std::net::SocketAddr {
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    std::fs::write(dir.join("ca.pem"), cert.pem()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = Arc::new(
        rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![cert.der().clone()],
                rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
            )
            .unwrap(),
    );
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let Ok(conn) = rustls::ServerConnection::new(cfg.clone()) else {
                continue;
            };
            let mut tls = rustls::StreamOwned::new(conn, stream);
            let mut buf = [0u8; 4096];
            let mut got = Vec::new();
            while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                match tls.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
            }
            let body = br#"{"error":{"message":"bad key","type":"invalid_request_error"}}"#;
            let head = format!(
                "HTTP/1.1 401 Unauthorized\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                body.len()
            );
            let _ = tls.write_all(head.as_bytes());
            let _ = tls.write_all(body);
            tls.conn.send_close_notify();
            let _ = tls.flush();
        }
    });
    addr
}

#[test]
fn tls_providers_are_checked_with_their_ca_and_a_refused_key_is_a_problem() {
    let dir = temp_dir("tls");
    let addr = tls_refusing_upstream(&dir);
    let ca = dir.join("ca.pem");
    let with_ca = format!(
        "[[provider]]\nname = \"private\"\nkind = \"openai\"\nbase_url = \"https://{addr}/v1\"\napi_key_env = \"DOCTOR_TLS_KEY\"\nca_file = \"{}\"\n",
        ca.display()
    );
    let (code, out) = doctor("tls-ca", &with_ca, &[("DOCTOR_TLS_KEY", "sk-refused")]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("GET /v1/models → 401, authentication refused (key from DOCTOR_TLS_KEY)"),
        "{out}"
    );
    assert!(
        !out.contains("sk-refused") && !out.contains("bad key"),
        "{out}"
    );
    // without the CA the handshake is what fails
    let without = format!(
        "[[provider]]\nname = \"private\"\nkind = \"openai\"\nbase_url = \"https://{addr}/v1\"\n"
    );
    let (code, out) = doctor("tls-noca", &without, &[]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("TLS handshake with 127.0.0.1"), "{out}");
    assert!(out.contains("ca_file"), "{out}");
}

#[test]
fn a_broken_config_is_a_problem_with_its_line() {
    let (code, out) = doctor(
        "bad",
        "[server]\nlisten = \"127.0.0.1:0\"\n\n[[model]]\nname = \"m\"\nprovider = \"nope\"\n",
        &[],
    );
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("line 6: "), "{out}");
    assert!(out.contains("edit "), "{out}");
    // the system part is still reported
    assert!(out.contains("driver: "), "{out}");
}

#[test]
fn cloud_providers_get_their_credentials_checked() {
    // Bedrock: SigV4 credentials from the environment (the chain's first source), never shown;
    // Vertex: a credentials file that is not there is a problem naming the token
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nshards = 1\n\n\
         [[provider]]\nname = \"aws\"\nkind = \"bedrock\"\nregion = \"us-east-1\"\nbase_url = \"http://{addr}\"\n\n\
         [[provider]]\nname = \"gcp\"\nkind = \"vertex\"\nproject = \"p\"\nlocation = \"us-central1\"\nbase_url = \"http://{addr}\"\ncredentials_file = \"/nonexistent/ringgate-doctor-sa.json\"\n\n\
         [[model]]\nname = \"claude-bedrock\"\nprovider = \"aws\"\nupstream_model = \"anthropic.claude-3-5-sonnet-20241022-v2:0\"\n"
    );
    let secret = "doctor-secret-access-key-value";
    let env = [
        ("AWS_ACCESS_KEY_ID", "AKIDDOCTOR"),
        ("AWS_SECRET_ACCESS_KEY", secret),
        ("AWS_BEARER_TOKEN_BEDROCK", ""),
        ("GOOGLE_APPLICATION_CREDENTIALS", ""),
        ("GCE_METADATA_HOST", "127.0.0.1:1"),
    ];
    let (code, out) = doctor("cloud", &text, &env);
    assert_eq!(code, 1, "{out}");
    for want in [
        &format!("ok    aws (http://{addr}): TCP {addr}"),
        "AWS credentials obtained in",
        &format!(
            "FAIL  gcp (http://{addr}/v1/projects/p/locations/us-central1): a Google access token:"
        ),
        "credentials_file on the provider",
    ] {
        assert!(out.contains(want), "missing {want:?} in:\n{out}");
    }
    assert!(
        !out.contains(secret),
        "a secret must never be printed:\n{out}"
    );
    drop(listener);
}
