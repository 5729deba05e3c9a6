//! An upstream base URL, parsed once at config time: scheme, host, port, path prefix — or a
//! co-located engine's Unix socket and path prefix (`unix:/run/vllm.sock:/v1`, see [`UNIX`]).
//!
//! Owns: `Endpoint` and its parser (host and path checked by `target`'s rules; a refused URL is
//! shown redacted, `config::redact_url`, so a `?key=` or password never reaches a log). Must
//! not: resolve names or open sockets.

/// Where a provider lives, as its SDK's `base_url` would say it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub tls: bool,
    /// Host name or IP literal, without brackets.
    pub host: String,
    pub port: u16,
    /// Path prefix without a trailing slash, e.g. `/v1` (may be empty).
    pub base_path: String,
    /// Value for the `Host` header (`host` or `host:port` when the port is not the default).
    pub host_header: String,
    /// The upstream pool's key for this endpoint's connections (built once, here).
    pub pool_key: PoolKey,
    /// `Some(path)`: a Unix-socket upstream (`unix:` form). Then `host` is `localhost` (the
    /// `Host` header), `port` 0 (nothing connects over TCP), `tls` false, and the pool key's
    /// host is the socket's path with port 0 (no TCP key has port 0).
    pub unix: Option<String>,
}

/// The Unix-socket form of a base URL: `unix:` + an absolute socket path, optionally followed
/// by `:` + the path prefix (`unix:/run/vllm.sock`, `unix:/run/vllm.sock:/v1`). The socket
/// path ends at the first `:` after `unix:` (so it has none), holds no space or control byte
/// and fits a `sockaddr_un` (107 bytes); the prefix follows the same rules as an http URL's
/// path. Requests carry `Host: localhost`.
pub const UNIX: &str = "unix:";
/// Longest socket path (`sun_path` is 108 bytes with its NUL).
const UNIX_PATH_MAX: usize = 107;

/// `https://rest` → `(true, rest)`, `http://rest` → `(false, rest)`; `None` for any other
/// scheme.
pub fn split_scheme(url: &str) -> Option<(bool, &str)> {
    match url.strip_prefix("https://") {
        Some(rest) => Some((true, rest)),
        None => url.strip_prefix("http://").map(|rest| (false, rest)),
    }
}

impl Endpoint {
    /// `url` parsed; its problem (with the URL redacted) when refused.
    pub fn parse(url: &str) -> Result<Endpoint, String> {
        Endpoint::parse_raw(url).map_err(|why| {
            format!(
                "base_url {:?}{why}",
                crate::config::redact_url(url).as_ref()
            )
        })
    }

    /// `parse`, the problem without the URL (`: the path …`, ` has no host`).
    fn parse_raw(url: &str) -> Result<Endpoint, String> {
        if let Some(rest) = url.strip_prefix(UNIX) {
            return parse_unix(rest);
        }
        let (tls, rest) =
            split_scheme(url).ok_or(" must start with http://, https:// or unix:/")?;
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        if authority.is_empty() {
            return Err(" has no host".to_string());
        }
        if authority.contains('@') {
            return Err(" must not carry credentials; use api_key_env".to_string());
        }
        let default_port = if tls { 443 } else { 80 };
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let end = v6
                .find(']')
                .ok_or_else(|| ": unterminated IPv6 literal".to_string())?;
            let host = &v6[..end];
            let after = &v6[end + 1..];
            let port = match after.strip_prefix(':') {
                Some(p) => parse_port(p)?,
                None if after.is_empty() => default_port,
                None => return Err(": junk after IPv6 literal".to_string()),
            };
            (host.to_string(), port)
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h.to_string(), parse_port(p)?),
                None => (authority.to_string(), default_port),
            }
        };
        if host.is_empty() {
            return Err(" has no host".to_string());
        }
        // Host and path end up in every request head: only bytes `target` allows.
        if let Err(why) = crate::http::target::host(&host) {
            return Err(format!(": the host {why}"));
        }
        let base_path = path.trim_end_matches('/').to_string();
        if let Err(why) = crate::http::target::path_prefix(&base_path) {
            return Err(format!(": the path {why}"));
        }
        let host_header = match (host.contains(':'), port == default_port) {
            (true, true) => format!("[{host}]"),
            (true, false) => format!("[{host}]:{port}"),
            (false, true) => host.clone(),
            (false, false) => format!("{host}:{port}"),
        };
        let pool_key = PoolKey {
            host: host.as_str().into(),
            port,
            tls,
        };
        Ok(Endpoint {
            tls,
            host,
            port,
            base_path,
            host_header,
            pool_key,
            unix: None,
        })
    }
}

/// The `unix:` form after its scheme: `/socket/path[:/prefix]` (see [`UNIX`]).
fn parse_unix(rest: &str) -> Result<Endpoint, String> {
    let (sock, path) = match rest.split_once(':') {
        Some((s, p)) => (s, p),
        None => (rest, ""),
    };
    if !sock.starts_with('/') {
        return Err(": the socket path must be absolute (unix:/run/engine.sock)".to_string());
    }
    if sock.len() > UNIX_PATH_MAX {
        return Err(format!(
            ": the socket path is longer than {UNIX_PATH_MAX} bytes"
        ));
    }
    if !sock.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(": the socket path has a space, control or non-ASCII byte".to_string());
    }
    if path.is_empty() && rest.ends_with(':') {
        return Err(
            ": nothing after the socket path's ':' (unix:/run/engine.sock:/v1)".to_string(),
        );
    }
    let base_path = path.trim_end_matches('/').to_string();
    if let Err(why) = crate::http::target::path_prefix(&base_path) {
        return Err(format!(": the path after the socket path {why}"));
    }
    Ok(Endpoint {
        tls: false,
        host: "localhost".to_string(),
        port: 0,
        base_path,
        host_header: "localhost".to_string(),
        pool_key: PoolKey {
            host: sock.into(),
            port: 0,
            tls: false,
        },
        unix: Some(sock.to_string()),
    })
}

fn parse_port(p: &str) -> Result<u16, String> {
    p.parse::<u16>()
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| format!(": invalid port {p:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table() {
        let cases: &[(&str, bool, &str, u16, &str, &str)] = &[
            (
                "http://127.0.0.1:9000/v1",
                false,
                "127.0.0.1",
                9000,
                "/v1",
                "127.0.0.1:9000",
            ),
            (
                "https://api.openai.com/v1/",
                true,
                "api.openai.com",
                443,
                "/v1",
                "api.openai.com",
            ),
            ("http://localhost", false, "localhost", 80, "", "localhost"),
            (
                "http://[::1]:8000/v1",
                false,
                "::1",
                8000,
                "/v1",
                "[::1]:8000",
            ),
        ];
        for (url, tls, host, port, path, hh) in cases {
            let e = Endpoint::parse(url).unwrap();
            assert_eq!(
                (
                    e.tls,
                    e.host.as_str(),
                    e.port,
                    e.base_path.as_str(),
                    e.host_header.as_str()
                ),
                (*tls, *host, *port, *path, *hh),
                "{url}"
            );
        }
    }

    #[test]
    fn rejects() {
        for bad in [
            "ftp://x",
            "http://",
            "http://:80",
            "http://h:0",
            "http://h:99999",
            "http://u:p@h",
            "http://[::1",
            "http://h /v1",
            "http://h\r\nx: y/v1",
            "http://h/v1 HTTP/1.1\r\n",
            "http://h/v1?x=1",
            "http://h/v1#f",
            "http://h/../v1",
            "http://[::1%eth0]:80",
        ] {
            assert!(Endpoint::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn unix_socket_form() {
        for (url, sock, path) in [
            ("unix:/run/vllm.sock", "/run/vllm.sock", ""),
            ("unix:/run/vllm.sock:/v1", "/run/vllm.sock", "/v1"),
            ("unix:/tmp/e.sock:/v1/", "/tmp/e.sock", "/v1"),
        ] {
            let e = Endpoint::parse(url).unwrap();
            assert_eq!(e.unix.as_deref(), Some(sock), "{url}");
            assert_eq!(
                (e.tls, e.port, e.base_path.as_str(), e.host_header.as_str()),
                (false, 0, path, "localhost"),
                "{url}"
            );
            assert_eq!((&*e.pool_key.host, e.pool_key.port), (sock, 0), "{url}");
        }
        let long = format!("unix:/{}", "s".repeat(107));
        for (bad, why) in [
            ("unix:run/vllm.sock", "must be absolute"),
            ("unix:", "must be absolute"),
            ("unix:/run/vllm.sock:", "nothing after"),
            ("unix:/run/vllm.sock:v1", "must start with '/'"),
            ("unix:/run/vllm.sock:/v1?x", "not allowed"),
            ("unix:/run/my engine.sock", "space, control"),
            ("unix:/run/e.sock\r\n", "space, control"),
            (long.as_str(), "longer than 107"),
        ] {
            let e = Endpoint::parse(bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
        assert!(Endpoint::parse("unix-ish://h")
            .unwrap_err()
            .contains("unix:/"));
    }
}

/// What an idle upstream connection is pooled under (`upstream::pool`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PoolKey {
    /// Shared with the endpoint it was made from (`Endpoint::pool_key`): a request copies the
    /// key without an allocation.
    pub host: std::sync::Arc<str>,
    pub port: u16,
    pub tls: bool,
}
