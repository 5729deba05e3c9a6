//! Doctor: every provider, the way the gateway will reach it — DNS, TCP connect, TLS handshake
//! (same roots and `ca_file` as the gateway) and an authenticated `GET /models` where the
//! provider has one, each with a short timeout. Blocking std sockets: this runs in the CLI,
//! never on a shard.
//!
//! Owns: those probes and their verdicts. Must not: print a key or a response body (an error
//! body may echo the key); only the env var's name and the status are shown.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::Report;
use crate::config::endpoint::Endpoint;
use crate::config::provider::ProviderKind;
use crate::config::{redact_url, Config, ProviderConfig};

/// Each step's timeout (DNS, connect, handshake, the models request).
const STEP: Duration = Duration::from_secs(3);
/// Largest models answer read.
const MAX_BODY: usize = 4 << 20;

pub fn check(r: &mut Report, cfg: &Config) {
    r.section("providers");
    if cfg.providers.is_empty() {
        r.info("none configured");
        return;
    }
    let needs_tls = cfg.providers.iter().any(|p| {
        p.base_url
            .as_ref()
            .is_some_and(|u| u.get_ref().starts_with("https://"))
    });
    let tls = if needs_tls {
        let ca: Vec<String> = cfg
            .providers
            .iter()
            .filter_map(|p| p.ca_file.clone())
            .collect();
        match crate::upstream::tls::client_config(&ca) {
            Ok(c) => Some(c),
            Err(e) => {
                r.problem(e, "point ca_file at a readable PEM CA certificate");
                None
            }
        }
    } else {
        None
    };
    for p in &cfg.providers {
        one(r, p, tls.as_ref());
    }
}

fn one(r: &mut Report, p: &ProviderConfig, tls: Option<&Arc<rustls::ClientConfig>>) {
    let name = p.name.get_ref();
    let kind = *p.kind.get_ref();
    // the cloud kinds have a public endpoint when base_url is not given
    let cloud = matches!(kind, ProviderKind::Bedrock | ProviderKind::Vertex);
    let url = match cloud {
        true => crate::config::cloud::base_url(p),
        false => p.base_url.as_ref().map(|u| u.get_ref().clone()),
    };
    let Some(url) = url else {
        r.ok(format!("{name}: in-process mock, nothing to reach"));
        return;
    };
    let shown = redact_url(&url).into_owned();
    let Ok(ep) = Endpoint::parse(&url) else {
        r.problem(
            format!("{name}: base_url {shown} does not parse"),
            "ringgate check --config FILE",
        );
        return;
    };
    let label = format!("{name} ({shown})");
    let mut done: Vec<String> = Vec::new();
    if let Some(sock) = &ep.unix {
        return unix(r, p, &ep, sock, label);
    }

    // DNS
    let addrs = match ep.host.parse::<IpAddr>() {
        Ok(ip) => vec![SocketAddr::new(ip, ep.port)],
        Err(_) => match lookup(&ep.host, ep.port) {
            Ok(a) => {
                done.push(format!("DNS {} → {}", ep.host, a[0].ip()));
                a
            }
            Err(e) => {
                r.problem(
                    format!("{label}: DNS {}: {e}", ep.host),
                    format!(
                        "check the host in base_url and the resolver (getent hosts {})",
                        ep.host
                    ),
                );
                return;
            }
        },
    };

    // TCP
    let t = Instant::now();
    let mut last = None;
    let mut stream = None;
    for a in &addrs {
        match TcpStream::connect_timeout(a, STEP) {
            Ok(s) => {
                stream = Some((s, *a));
                break;
            }
            Err(e) => last = Some((*a, e)),
        }
    }
    let Some((sock, addr)) = stream else {
        let (a, e) = match last {
            Some((a, e)) => (a.to_string(), e.to_string()),
            None => (ep.host.clone(), "no address".into()),
        };
        r.problem(
            format!("{label}: TCP connect to {a}: {e}"),
            "is the provider up and reachable from this box (port, firewall, proxy)?",
        );
        return;
    };
    done.push(format!(
        "TCP {addr} {:.1} ms",
        t.elapsed().as_secs_f64() * 1e3
    ));
    let _ = sock.set_read_timeout(Some(STEP));
    let _ = sock.set_write_timeout(Some(STEP));

    // TLS, then GET /models on the same connection
    let key = key(p);
    let path = models_path(kind, &ep, p);
    let answer = if ep.tls {
        let Some(tls) = tls else { return };
        let Ok(server) = rustls::pki_types::ServerName::try_from(ep.host.clone()) else {
            r.problem(
                format!("{label}: {} is not a TLS server name", ep.host),
                "fix base_url",
            );
            return;
        };
        let Ok(conn) = rustls::ClientConnection::new(tls.clone(), server) else {
            r.problem(format!("{label}: TLS setup failed"), "fix base_url");
            return;
        };
        let mut s = rustls::StreamOwned::new(conn, sock);
        let t = Instant::now();
        while s.conn.is_handshaking() {
            match s.conn.complete_io(&mut s.sock) {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    r.problem(
                    format!("{label}: TLS handshake with {}: {e}", ep.host),
                    "a private CA needs ca_file = \"/path/ca.pem\" on the provider; check the name in base_url",
                    );
                    return;
                }
            }
        }
        let v = s
            .conn
            .protocol_version()
            .map_or("TLS".into(), |v| format!("{v:?}"));
        done.push(format!("{v} {:.1} ms", t.elapsed().as_secs_f64() * 1e3));
        path.as_ref()
            .map(|path| get(&mut s, path, &ep, kind, key.as_ref().map(|k| k.1.clone())))
    } else {
        let mut s = sock;
        path.as_ref()
            .map(|path| get(&mut s, path, &ep, kind, key.as_ref().map(|k| k.1.clone())))
    };

    verdict(r, p, &label, done, path, answer, key);
}

/// A co-located engine's Unix socket (`base_url = "unix:…"`): no DNS, TCP or TLS; connect,
/// then the same `GET` of its models and the same verdict.
fn unix(r: &mut Report, p: &ProviderConfig, ep: &Endpoint, sock: &str, label: String) {
    let t = Instant::now();
    let mut s = match std::os::unix::net::UnixStream::connect(sock) {
        Ok(s) => s,
        Err(e) => {
            r.problem(
                format!("{label}: connect to the socket {sock}: {e}"),
                "is the engine up and listening on this socket (e.g. vLLM --uds), and may the gateway's user open it?",
            );
            return;
        }
    };
    let done = vec![format!(
        "socket {sock} {:.1} ms",
        t.elapsed().as_secs_f64() * 1e3
    )];
    let _ = s.set_read_timeout(Some(STEP));
    let _ = s.set_write_timeout(Some(STEP));
    let kind = *p.kind.get_ref();
    let key = key(p);
    let path = models_path(kind, ep, p);
    let answer = path
        .as_ref()
        .map(|path| get(&mut s, path, ep, kind, key.as_ref().map(|k| k.1.clone())));
    verdict(r, p, &label, done, path, answer, key);
}

/// What the models request (or the cloud credentials) say, reported under `label` after the
/// steps in `done`.
fn verdict(
    r: &mut Report,
    p: &ProviderConfig,
    label: &str,
    mut done: Vec<String>,
    path: Option<String>,
    answer: Option<Result<(u16, Option<usize>), String>>,
    key: Option<(String, String)>,
) {
    let kind = *p.kind.get_ref();
    let key_note = match &key {
        Some((env, _)) => format!("key from {env}"),
        None => "no key".into(),
    };
    match (path, answer) {
        (None, _) | (_, None) => {
            match super::cloud::credentials(p, key.as_ref().map(|k| k.0.as_str())) {
                Some(Ok(found)) => done.push(found),
                Some(Err((problem, fix))) => {
                    r.problem(format!("{label}: {problem}"), fix);
                    return;
                }
                None => done.push(format!("no models endpoint checked for kind {kind:?}")),
            }
        }
        (Some(path), Some(Err(e))) => {
            r.problem(
                format!("{label}: GET {path}: {e}"),
                "is base_url the provider's API root (OpenAI-style bases end in /v1)?",
            );
            return;
        }
        (Some(path), Some(Ok((status, models)))) => match status {
            200..=299 => done.push(format!(
                "GET {path} {status}{} ({key_note})",
                models
                    .map(|n| format!(", {n} model(s)"))
                    .unwrap_or_default()
            )),
            401 | 403 => {
                let fix = match p.key_refs().first() {
                    None => "set api_key_env on the provider to the env var holding its key".into(),
                    Some((env, _)) if key.is_none() => {
                        format!("export {env}=<the provider's key> in the gateway's environment")
                    }
                    Some(_) => "the key was refused: check it, and that it may list models".into(),
                };
                r.problem(
                    format!("{label}: GET {path} → {status}, authentication refused ({key_note})"),
                    fix,
                );
                return;
            }
            404 => {
                r.warn(
                    format!("{label}: GET {path} → 404 (reached, but no models list there)"),
                    "check base_url's path (OpenAI-style bases end in /v1; Anthropic and Gemini bases have none)",
                );
                return;
            }
            _ => {
                r.problem(
                    format!("{label}: GET {path} → {status}"),
                    "the provider answers with an error: check its status and base_url",
                );
                return;
            }
        },
    }
    r.ok(format!("{label}: {}", done.join(", ")));
}

/// System resolver on a helper thread, at most [`STEP`].
fn lookup(host: &str, port: u16) -> Result<Vec<SocketAddr>, String> {
    let (tx, rx) = std::sync::mpsc::channel();
    let h = host.to_string();
    std::thread::spawn(move || {
        let _ = tx.send(crate::upstream::resolve::system_lookup(&h, port));
    });
    match rx.recv_timeout(STEP) {
        Ok(Ok(a)) if !a.is_empty() => Ok(a),
        Ok(Ok(_)) => Err("no address".into()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer within {} s", STEP.as_secs())),
    }
}

/// The first usable key: (env var name, value). Never shown.
fn key(p: &ProviderConfig) -> Option<(String, String)> {
    p.key_refs().into_iter().find_map(|(env, _)| {
        let v = std::env::var(env).ok()?;
        crate::http::target::header_value(&v).ok()?;
        Some((env.to_string(), v))
    })
}

/// Where the provider lists its models, when it does.
fn models_path(kind: ProviderKind, ep: &Endpoint, p: &ProviderConfig) -> Option<String> {
    let base = &ep.base_path;
    Some(match kind {
        ProviderKind::OpenAi | ProviderKind::OpenAiCompatible => format!("{base}/models"),
        ProviderKind::Anthropic => format!("{base}/v1/models"),
        ProviderKind::Gemini => format!("{base}/v1beta/models"),
        ProviderKind::Azure => {
            let v = p
                .api_version
                .as_ref()
                .map_or(crate::config::provider::DEFAULT_AZURE_API_VERSION, |v| {
                    v.get_ref()
                });
            format!("{base}/openai/models?api-version={v}")
        }
        // signed or token-authorised APIs: the doctor's plain GET cannot list them
        ProviderKind::Mock | ProviderKind::Bedrock | ProviderKind::Vertex => return None,
    })
}

/// `GET path` with `Connection: close`; (status, number of models listed when the body says).
fn get<S: Read + Write>(
    s: &mut S,
    path: &str,
    ep: &Endpoint,
    kind: ProviderKind,
    key: Option<String>,
) -> Result<(u16, Option<usize>), String> {
    let mut req = format!(
        "GET {path} HTTP/1.1\r\nHost: {}\r\nAccept: application/json\r\nUser-Agent: ringgate-doctor\r\nConnection: close\r\n",
        ep.host_header
    )
    .into_bytes();
    req.extend_from_slice(&crate::route::auth_headers(kind, key.as_deref()));
    req.extend_from_slice(b"\r\n");
    s.write_all(&req)
        .and_then(|_| s.flush())
        .map_err(|e| format!("write: {e}"))?;
    let (status, body) = read_response(s)?;
    let models = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| {
            v.get("data")
                .or_else(|| v.get("models"))
                .and_then(|d| d.as_array())
                .map(Vec::len)
        });
    Ok((status, models))
}

/// Read an answer to a `Connection: close` request until the peer closes (at most
/// `MAX_BODY` bytes, within `STEP`): its status and its body (de-chunked).
pub(super) fn read_response<S: Read>(s: &mut S) -> Result<(u16, Vec<u8>), String> {
    let deadline = Instant::now() + STEP;
    let mut buf = Vec::new();
    let mut tmp = [0u8; 16 << 10];
    loop {
        match s.read(&mut tmp) {
            Ok(0) => break,
            Ok(n) => buf.extend_from_slice(&tmp[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            // what came is the answer (rustls reports a close without close_notify as
            // UnexpectedEof; a plain socket's read timeout)
            Err(_) if !buf.is_empty() => break,
            Err(e) => return Err(format!("read: {e}")),
        }
        if buf.len() > MAX_BODY || Instant::now() > deadline {
            break;
        }
    }
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut resp = httparse::Response::new(&mut headers);
    let head_len = match resp.parse(&buf) {
        Ok(httparse::Status::Complete(n)) => n,
        _ => return Err("no valid HTTP response".into()),
    };
    let status = resp.code.unwrap_or(0);
    let chunked = resp.headers.iter().any(|h| {
        h.name.eq_ignore_ascii_case("transfer-encoding")
            && String::from_utf8_lossy(h.value)
                .to_ascii_lowercase()
                .contains("chunked")
    });
    let raw = &buf[head_len..];
    let body = if chunked { dechunk(raw) } else { raw.to_vec() };
    Ok((status, body))
}

/// A chunked body's data (best effort: stops at the first malformed size line).
pub(super) fn dechunk(mut raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(i) = raw.windows(2).position(|w| w == b"\r\n") {
        let size = std::str::from_utf8(&raw[..i])
            .ok()
            .and_then(|l| usize::from_str_radix(l.split(';').next().unwrap_or("").trim(), 16).ok());
        let Some(size) = size else { break };
        raw = &raw[i + 2..];
        if size == 0 || raw.len() < size {
            break;
        }
        out.extend_from_slice(&raw[..size]);
        raw = raw.get(size + 2..).unwrap_or(&[]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dechunks_and_picks_the_models_path() {
        assert_eq!(dechunk(b"3\r\nabc\r\n2;x=1\r\nde\r\n0\r\n\r\n"), b"abcde");
        let ep = Endpoint::parse("https://api.anthropic.com").unwrap();
        let cfg = Config::parse(
            "[[provider]]\nname = \"a\"\nkind = \"anthropic\"\nbase_url = \"https://api.anthropic.com\"\n",
        )
        .unwrap();
        assert_eq!(
            models_path(ProviderKind::Anthropic, &ep, &cfg.providers[0]).as_deref(),
            Some("/v1/models")
        );
    }
}
