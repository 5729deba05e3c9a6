//! Browser-facing checks on a request head, decided before admission: the `Origin` allow-list
//! (cross-site requests, CORS preflights) and, on a loopback listener, a `Host` that must name
//! the loopback (DNS rebinding) — and so must the authority of an absolute-form target. A request from a browser page on another site carries an
//! `Origin`; SDKs and curl send none, so they never reach the allow-list.
//!
//! Owns: `EdgePolicy`, `Verdict`, the preflight answer and the CORS response header lines.
//! Must not: allocate or copy on the common path (no `Origin`, a loopback `Host`: byte compares
//! on ranges the head parser already found), read bodies, or do IO.

use super::head::{Method, RequestHead};
use crate::error::{Error, Kind};

/// What the checks decided for one request head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// No `Origin`: serve as usual.
    Plain,
    /// An allowed `Origin`: serve, with CORS headers on the response.
    Cors,
    /// An allowed CORS preflight (`OPTIONS` + `Access-Control-Request-Method`): answer 204.
    Preflight,
}

/// Per-shard copy of `server.cors_allow_origins` and the loopback `Host` rule.
#[derive(Debug, Clone, Default)]
pub struct EdgePolicy {
    origins: Vec<Box<[u8]>>,
    any_origin: bool,
    /// The listener is a loopback address: `Host` must be a loopback name or address.
    loopback_only: bool,
    /// The same for the TLS listener (`server.tls_listen`), judged on its own address.
    tls_loopback_only: bool,
    /// `server.allowed_hosts`: more names (without port) accepted on a loopback listener.
    extra_hosts: Vec<Box<[u8]>>,
}

/// Preflight answers may be cached by the browser this long (seconds).
const PREFLIGHT_MAX_AGE: u32 = 600;

impl EdgePolicy {
    pub fn new(origins: &[String], loopback_listener: bool, extra_hosts: &[String]) -> Self {
        EdgePolicy {
            origins: origins
                .iter()
                .filter(|o| o.as_str() != "*")
                .map(|o| o.as_bytes().into())
                .collect(),
            any_origin: origins.iter().any(|o| o == "*"),
            loopback_only: loopback_listener,
            tls_loopback_only: loopback_listener,
            extra_hosts: extra_hosts.iter().map(|h| h.as_bytes().into()).collect(),
        }
    }

    /// Whether the TLS listener is a loopback address (default: as the plain one).
    pub fn with_tls_listener(mut self, loopback: bool) -> Self {
        self.tls_loopback_only = loopback;
        self
    }

    /// Decide on a parsed head. An error is a 403 to send before anything else happens.
    pub fn check(&self, head: &RequestHead, buf: &[u8]) -> Result<Verdict, Error> {
        self.check_on(head, buf, false)
    }

    /// As [`EdgePolicy::check`], for a head that came through the TLS listener when `tls`.
    pub fn check_on(&self, head: &RequestHead, buf: &[u8], tls: bool) -> Result<Verdict, Error> {
        let loopback_only = if tls {
            self.tls_loopback_only
        } else {
            self.loopback_only
        };
        if loopback_only {
            // An absolute-form target's authority names the host instead of `Host` (RFC 9112
            // §3.2.2): both must name this gateway, so that neither can carry a foreign name.
            for host in [&head.host, &head.authority] {
                if let Some(host) = head.header(buf, host) {
                    if !is_loopback_host(host) && !self.extra_host(host) {
                        return Err(Error::new(
                            Kind::Forbidden,
                            "the Host header does not name this gateway (it listens on loopback only; see server.allowed_hosts)",
                        ));
                    }
                }
            }
        }
        let Some(origin) = head.header(buf, &head.origin) else {
            return Ok(Verdict::Plain);
        };
        if !self.allows(origin) {
            return Err(Error::new(
                Kind::Forbidden,
                "cross-origin requests are not allowed from this Origin (see server.cors_allow_origins)",
            ));
        }
        if head.method == Method::Options && head.ac_request_method {
            return Ok(Verdict::Preflight);
        }
        Ok(Verdict::Cors)
    }

    fn allows(&self, origin: &[u8]) -> bool {
        self.any_origin || self.origins.iter().any(|o| o.eq_ignore_ascii_case(origin))
    }

    fn extra_host(&self, host: &[u8]) -> bool {
        if self.extra_hosts.is_empty() {
            return false;
        }
        let name = split_port(host).map_or(host, |(h, _)| h);
        self.extra_hosts
            .iter()
            .any(|h| h.eq_ignore_ascii_case(name))
    }
}

/// Header lines added to every response to an allowed cross-origin request.
pub fn cors_headers(out: &mut Vec<u8>, origin: &[u8]) {
    out.extend_from_slice(b"access-control-allow-origin: ");
    out.extend_from_slice(origin);
    out.extend_from_slice(b"\r\nvary: Origin\r\n");
}

/// The whole 204 answer to an allowed preflight (no body, so no Content-Length: RFC 9110
/// §8.6). The requested headers are echoed: the origin is trusted by configuration.
pub fn preflight_response(
    out: &mut Vec<u8>,
    origin: &[u8],
    request_headers: Option<&[u8]>,
    keep_alive: bool,
) {
    out.extend_from_slice(b"HTTP/1.1 204 No Content\r\n");
    cors_headers(out, origin);
    out.extend_from_slice(b"access-control-allow-methods: GET, POST, OPTIONS\r\n");
    if let Some(h) = request_headers.filter(|h| !h.is_empty()) {
        out.extend_from_slice(b"access-control-allow-headers: ");
        out.extend_from_slice(h);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(format!("access-control-max-age: {PREFLIGHT_MAX_AGE}\r\n").as_bytes());
    if !keep_alive {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// `localhost`, `*.localhost`, `127.0.0.0/8` or `[::1]`, each with an optional `:port`.
pub fn is_loopback_host(v: &[u8]) -> bool {
    let host = match split_port(v) {
        Some((h, _)) => h,
        None if v.first() == Some(&b'[') => return false,
        None => v,
    };
    if host == b"[::1]" {
        return true;
    }
    let name = host.strip_suffix(b".").unwrap_or(host);
    const LOCALHOST: &[u8] = b"localhost";
    if name.eq_ignore_ascii_case(LOCALHOST) {
        return true;
    }
    if name.len() > LOCALHOST.len() + 1 {
        let (sub, tail) = name.split_at(name.len() - LOCALHOST.len() - 1);
        if tail[0] == b'.' && tail[1..].eq_ignore_ascii_case(LOCALHOST) && !sub.is_empty() {
            return true;
        }
    }
    is_127(host)
}

/// `(host, port)` of `host:port` / `[v6]:port` / `[v6]` (port empty); None for a bare name or a
/// malformed port.
fn split_port(v: &[u8]) -> Option<(&[u8], &[u8])> {
    let (host, port) = if v.first() == Some(&b'[') {
        let end = memchr::memchr(b']', v)?;
        let (h, rest) = v.split_at(end + 1);
        match rest {
            [] => (h, &rest[..0]),
            [b':', port @ ..] => (h, port),
            _ => return None,
        }
    } else {
        let i = memchr::memrchr(b':', v)?;
        (&v[..i], &v[i + 1..])
    };
    (port.len() <= 5 && port.iter().all(u8::is_ascii_digit)).then_some((host, port))
}

/// A dotted-quad IPv4 address in 127.0.0.0/8.
fn is_127(h: &[u8]) -> bool {
    let mut parts = 0;
    for (i, p) in h.split(|&b| b == b'.').enumerate() {
        if i > 3 || p.is_empty() || p.len() > 3 || !p.iter().all(u8::is_ascii_digit) {
            return false;
        }
        let n = p.iter().fold(0u32, |a, &d| a * 10 + u32::from(d - b'0'));
        if n > 255 || (i == 0 && n != 127) {
            return false;
        }
        parts += 1;
    }
    parts == 4
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::head::parse;

    #[test]
    fn loopback_hosts() {
        let yes = [
            "localhost",
            "LOCALHOST:8080",
            "localhost.",
            "app.localhost",
            "a.b.localhost:1",
            "127.0.0.1",
            "127.0.0.1:8080",
            "127.255.1.2:65535",
            "[::1]",
            "[::1]:8080",
        ];
        let no = [
            "evil.com",
            "localhost.evil.com",
            "evillocalhost",
            ".localhost",
            "127.0.0.1.evil.com",
            "128.0.0.1",
            "127.0.0",
            "127.0.0.256",
            "127.0.0.1:80x",
            "127.0.0.1:123456",
            "[::2]",
            "[::1]x",
            "[::1",
            "0.0.0.0",
            "",
            "t",
        ];
        for h in yes {
            assert!(is_loopback_host(h.as_bytes()), "{h}");
        }
        for h in no {
            assert!(!is_loopback_host(h.as_bytes()), "{h}");
        }
    }

    fn verdict(p: &EdgePolicy, head: &str) -> Result<Verdict, u16> {
        let h = parse(head.as_bytes(), 4096, 64).unwrap().unwrap();
        p.check(&h, head.as_bytes()).map_err(|e| e.status())
    }

    #[test]
    fn origin_and_host_table() {
        let closed = EdgePolicy::new(&[], true, &[]);
        let open = EdgePolicy::new(
            &["https://app.example".into()],
            true,
            &["gw.internal".into()],
        );
        let any = EdgePolicy::new(&["*".into()], false, &[]);
        let cases: &[(&EdgePolicy, &str, Result<Verdict, u16>)] = &[
            (&closed, "POST / HTTP/1.1\r\nHost: localhost:8080\r\n\r\n", Ok(Verdict::Plain)),
            (&closed, "POST / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", Ok(Verdict::Plain)),
            (&closed, "POST / HTTP/1.1\r\nHost: evil.example\r\n\r\n", Err(403)),
            (&closed, "POST / HTTP/1.1\r\nHost: localhost\r\nOrigin: https://evil.example\r\n\r\n", Err(403)),
            (&closed, "POST / HTTP/1.1\r\nHost: localhost\r\nOrigin: null\r\n\r\n", Err(403)),
            (&open, "POST / HTTP/1.1\r\nHost: localhost\r\nOrigin: https://app.example\r\n\r\n", Ok(Verdict::Cors)),
            (&open, "POST / HTTP/1.1\r\nHost: localhost\r\nOrigin: HTTPS://APP.EXAMPLE\r\n\r\n", Ok(Verdict::Cors)),
            (&open, "POST / HTTP/1.1\r\nHost: localhost\r\nOrigin: https://app.example.evil\r\n\r\n", Err(403)),
            (&open, "OPTIONS / HTTP/1.1\r\nHost: localhost\r\nOrigin: https://app.example\r\nAccess-Control-Request-Method: POST\r\n\r\n", Ok(Verdict::Preflight)),
            (&open, "OPTIONS / HTTP/1.1\r\nHost: localhost\r\nOrigin: https://evil.example\r\nAccess-Control-Request-Method: POST\r\n\r\n", Err(403)),
            (&open, "OPTIONS / HTTP/1.1\r\nHost: localhost\r\nOrigin: https://app.example\r\n\r\n", Ok(Verdict::Cors)),
            (&open, "GET / HTTP/1.1\r\nHost: gw.internal:8080\r\n\r\n", Ok(Verdict::Plain)),
            (&open, "GET / HTTP/1.1\r\nHost: other.internal\r\n\r\n", Err(403)),
            (&any, "POST / HTTP/1.1\r\nHost: anything.example\r\nOrigin: https://x.example\r\n\r\n", Ok(Verdict::Cors)),
            // absolute-form targets: the authority and the Host header must both pass
            (&closed, "GET http://localhost:8080/v1/models HTTP/1.1\r\nHost: localhost\r\n\r\n", Ok(Verdict::Plain)),
            (&closed, "GET HTTP://[::1]/v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", Ok(Verdict::Plain)),
            (&closed, "GET http://evil.example/v1/models HTTP/1.1\r\nHost: localhost\r\n\r\n", Err(403)),
            (&closed, "GET http://localhost/v1/models HTTP/1.1\r\nHost: evil.example\r\n\r\n", Err(403)),
            (&closed, "GET https://evil.example:443/ HTTP/1.1\r\nHost: localhost\r\n\r\n", Err(403)),
            (&open, "GET http://gw.internal/v1/models HTTP/1.1\r\nHost: localhost\r\n\r\n", Ok(Verdict::Plain)),
            (&any, "GET http://evil.example/v1/models HTTP/1.1\r\nHost: evil.example\r\n\r\n", Ok(Verdict::Plain)),
        ];
        for (p, head, want) in cases {
            assert_eq!(verdict(p, head), *want, "{head:?}");
        }
    }

    #[test]
    fn preflight_answer() {
        let mut out = Vec::new();
        preflight_response(
            &mut out,
            b"https://a.example",
            Some(b"content-type, authorization"),
            true,
        );
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("HTTP/1.1 204 No Content\r\n"), "{text}");
        assert!(text.contains("access-control-allow-origin: https://a.example\r\n"));
        assert!(text.contains("access-control-allow-headers: content-type, authorization\r\n"));
        assert!(text.contains("access-control-max-age: 600\r\n"));
        assert!(!text.to_ascii_lowercase().contains("content-length"));
        assert!(text.ends_with("\r\n\r\n"));
    }
}
