//! A small blocking HTTP/1.1 client for the credential helper threads (AWS STS, container
//! credentials, IMDS; Google's token endpoint and metadata server): one request per connection
//! (`connection: close`), `http://` or `https://` (rustls, the process's roots), connect 5 s,
//! each read and write 10 s, the answer at most 1 MiB (Content-Length, chunked or close).
//!
//! Owns: `fetch`. Must not: run on a shard (it blocks), follow redirects, or log (its callers
//! decide what of an answer may be shown: never a credential).

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

const CONNECT: Duration = Duration::from_secs(5);
const IO: Duration = Duration::from_secs(10);
/// Longest answer read.
pub const MAX_ANSWER: usize = 1 << 20;

/// An answer: status and body.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub body: Vec<u8>,
}

/// `scheme://host[:port]` and the request target of `url`.
pub struct Url<'a> {
    pub tls: bool,
    pub host: &'a str,
    pub port: u16,
    /// `host` or `host:port` as the `Host` header says it.
    pub authority: &'a str,
    pub target: &'a str,
}

/// Split `url` (`http://` or `https://`).
pub fn parse_url(url: &str) -> Result<Url<'_>, String> {
    let (tls, rest) = crate::config::endpoint::split_scheme(url)
        .ok_or("the URL must start with http:// or https://")?;
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, target) = rest.split_at(end);
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (h, after) = v6.split_once(']').ok_or("an unterminated IPv6 literal")?;
        match after.strip_prefix(':') {
            Some(p) => (h, p.parse().map_err(|_| "a bad port")?),
            None => (h, if tls { 443 } else { 80 }),
        }
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, p.parse().map_err(|_| "a bad port")?),
            None => (authority, if tls { 443 } else { 80 }),
        }
    };
    if host.is_empty() || authority.contains('@') {
        return Err("the URL has no usable host".into());
    }
    let target = if target.is_empty() { "/" } else { target };
    if target.bytes().any(|b| b <= b' ' || b == 0x7f || b >= 0x80) {
        return Err("the URL's path has a space or control byte".into());
    }
    Ok(Url {
        tls,
        host,
        port,
        authority,
        target,
    })
}

fn tls_config() -> Result<Arc<rustls::ClientConfig>, String> {
    static CFG: OnceLock<Result<Arc<rustls::ClientConfig>, String>> = OnceLock::new();
    CFG.get_or_init(|| crate::upstream::tls::client_config(&[]))
        .clone()
}

/// Send one request; `headers` are whole lines (`name: value\r\n`).
pub fn fetch(method: &str, url: &str, headers: &[u8], body: &[u8]) -> Result<Reply, String> {
    let u = parse_url(url)?;
    let addr = (u.host, u.port)
        .to_socket_addrs()
        .map_err(|e| format!("{}: {e}", u.host))?
        .next()
        .ok_or_else(|| format!("{}: no address", u.host))?;
    let sock = TcpStream::connect_timeout(&addr, CONNECT).map_err(|e| format!("{addr}: {e}"))?;
    let _ = sock.set_read_timeout(Some(IO));
    let _ = sock.set_write_timeout(Some(IO));
    let _ = sock.set_nodelay(true);
    let mut head = Vec::with_capacity(256 + headers.len());
    head.extend_from_slice(method.as_bytes());
    head.push(b' ');
    head.extend_from_slice(u.target.as_bytes());
    head.extend_from_slice(b" HTTP/1.1\r\nhost: ");
    head.extend_from_slice(u.authority.as_bytes());
    head.extend_from_slice(b"\r\nconnection: close\r\nuser-agent: ringgate/");
    head.extend_from_slice(env!("CARGO_PKG_VERSION").as_bytes());
    head.extend_from_slice(b"\r\n");
    if !body.is_empty() || method == "POST" || method == "PUT" {
        head.extend_from_slice(format!("content-length: {}\r\n", body.len()).as_bytes());
    }
    head.extend_from_slice(headers);
    head.extend_from_slice(b"\r\n");
    head.extend_from_slice(body);
    let raw = if u.tls {
        let name = rustls::pki_types::ServerName::try_from(u.host.to_string())
            .map_err(|_| format!("{} is not a TLS server name", u.host))?;
        let conn =
            rustls::ClientConnection::new(tls_config()?, name).map_err(|e| format!("TLS: {e}"))?;
        let mut s = rustls::StreamOwned::new(conn, sock);
        exchange(&mut s, &head)?
    } else {
        let mut s = sock;
        exchange(&mut s, &head)?
    };
    parse_reply(&raw)
}

fn exchange<S: Read + Write>(s: &mut S, head: &[u8]) -> Result<Vec<u8>, String> {
    s.write_all(head).map_err(|e| format!("write: {e}"))?;
    let _ = s.flush();
    let mut raw = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                raw.extend_from_slice(&buf[..n]);
                if raw.len() > MAX_ANSWER + 64 * 1024 {
                    return Err("the answer is larger than 1 MiB".into());
                }
                if complete(&raw) {
                    break;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            // a TLS peer that closes without close_notify: what arrived is the answer
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !raw.is_empty() => break,
            Err(e) => return Err(format!("read: {e}")),
        }
    }
    Ok(raw)
}

/// Whether `raw` holds a whole answer framed by Content-Length (else: read to close).
fn complete(raw: &[u8]) -> bool {
    let Some(end) = memchr::memmem::find(raw, b"\r\n\r\n") else {
        return false;
    };
    let head = String::from_utf8_lossy(&raw[..end]).to_ascii_lowercase();
    head.lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse::<usize>().ok())
        .is_some_and(|n| raw.len() >= end + 4 + n)
}

fn parse_reply(raw: &[u8]) -> Result<Reply, String> {
    let end = memchr::memmem::find(raw, b"\r\n\r\n").ok_or("the answer has no whole head")?;
    let head = String::from_utf8_lossy(&raw[..end]);
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse::<u16>().ok())
        .ok_or("the answer has no status line")?;
    let mut length = None;
    let mut chunked = false;
    for l in lines {
        let Some((k, v)) = l.split_once(':') else {
            continue;
        };
        if k.trim().eq_ignore_ascii_case("content-length") {
            length = v.trim().parse::<usize>().ok();
        } else if k.trim().eq_ignore_ascii_case("transfer-encoding")
            && v.to_ascii_lowercase().contains("chunked")
        {
            chunked = true;
        }
    }
    let rest = &raw[end + 4..];
    let body = if chunked {
        dechunk(rest)?
    } else if let Some(n) = length {
        rest.get(..n)
            .ok_or("the answer is shorter than its length")?
            .to_vec()
    } else {
        rest.to_vec()
    };
    if body.len() > MAX_ANSWER {
        return Err("the answer is larger than 1 MiB".into());
    }
    Ok(Reply { status, body })
}

fn dechunk(mut b: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    loop {
        let nl = memchr::memmem::find(b, b"\r\n").ok_or("a cut chunk size")?;
        let size = std::str::from_utf8(&b[..nl])
            .ok()
            .and_then(|s| usize::from_str_radix(s.split(';').next().unwrap_or("").trim(), 16).ok())
            .ok_or("a bad chunk size")?;
        b = &b[nl + 2..];
        if size == 0 {
            return Ok(out);
        }
        let data = b.get(..size).ok_or("a cut chunk")?;
        out.extend_from_slice(data);
        if out.len() > MAX_ANSWER {
            return Err("the answer is larger than 1 MiB".into());
        }
        b = b.get(size + 2..).ok_or("a cut chunk")?;
    }
}

/// `application/x-www-form-urlencoded` value encoding.
pub fn form_value(s: &str, out: &mut String) {
    for &b in s.as_bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_answers() {
        let u = parse_url("http://127.0.0.1:9/a?b=1").unwrap();
        assert_eq!(
            (u.host, u.port, u.target, u.tls),
            ("127.0.0.1", 9, "/a?b=1", false)
        );
        let u = parse_url("https://[::1]").unwrap();
        assert_eq!((u.host, u.port, u.target), ("::1", 443, "/"));
        assert!(parse_url("ftp://x").is_err());
        assert!(parse_url("http://u:p@h/").is_err());
        let r = parse_reply(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
        )
        .unwrap();
        assert_eq!((r.status, &r.body[..]), (200, &b"abc"[..]));
        let r = parse_reply(b"HTTP/1.0 404 No\r\nContent-Length: 2\r\n\r\nxyz").unwrap();
        assert_eq!((r.status, &r.body[..]), (404, &b"xy"[..]));
    }
}
