//! Shared helpers for integration tests: start the mock and the gateway on 127.0.0.1 port 0,
//! and a small blocking HTTP/1.1 client that checks framing itself.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ringgate::config::Config;
use ringgate::gateway::{self, Running};
use ringgate::mock::{fault::Plan, server::MockServer, Profile};
use ringgate::shard::DriverChoice;

pub mod capture;

pub const DRIVERS: [&str; 2] = ["epoll", "io_uring"];

pub fn driver_choice(d: &str) -> DriverChoice {
    if d == "epoll" {
        DriverChoice::Epoll
    } else {
        DriverChoice::IoUring
    }
}

pub fn start_mock(profile: Profile, driver: &str) -> MockServer {
    ringgate::mock::server::start(
        "127.0.0.1:0".parse().unwrap(),
        profile,
        1,
        driver_choice(driver),
    )
    .unwrap()
}

/// The mock with a per-process fault plan (see `ringgate::mock::fault`).
pub fn start_mock_faulty(profile: Profile, driver: &str, plan: Plan) -> MockServer {
    ringgate::mock::server::start_with(
        "127.0.0.1:0".parse().unwrap(),
        profile,
        1,
        driver_choice(driver),
        plan,
    )
    .unwrap()
}

/// Gateway in front of `upstream`, with `extra` TOML appended (after the models).
pub fn start_gateway(upstream: SocketAddr, driver: &str, extra: &str) -> Running {
    start_gateway_with(upstream, driver, "", extra)
}

/// As `start_gateway`, with extra lines inside `[server]`.
pub fn start_gateway_with(
    upstream: SocketAddr,
    driver: &str,
    server_extra: &str,
    extra: &str,
) -> Running {
    let text = format!(
        r#"
[server]
listen = "127.0.0.1:0"
shards = 1
pin = false
driver = "{driver}"
header_timeout_ms = 500
{server_extra}

[upstream]
first_byte_timeout_ms = 3000

[[provider]]
name = "local"
kind = "openai"
base_url = "http://{upstream}/v1"

[[model]]
name = "gpt-4o-mini"
provider = "local"

[[model]]
name = "alias"
provider = "local"
upstream_model = "real-model"
{extra}
"#
    );
    let cfg = Config::parse(&text).unwrap();
    gateway::start(cfg).unwrap()
}

#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

pub fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.set_nodelay(true).unwrap();
    s
}

/// Read one response from `s` (Content-Length, chunked, or close-delimited).
/// (Any byte stream: a TcpStream, or a TLS stream over one.)
pub fn read_response<S: Read>(s: &mut S, buf: &mut Vec<u8>) -> Option<Response> {
    let mut tmp = [0u8; 65536];
    let (status, headers, head_len) = loop {
        let mut hs = [httparse::EMPTY_HEADER; 64];
        let mut r = httparse::Response::new(&mut hs);
        if let Ok(httparse::Status::Complete(n)) = r.parse(buf) {
            let headers: Vec<(String, String)> = r
                .headers
                .iter()
                .map(|h| {
                    (
                        h.name.to_ascii_lowercase(),
                        String::from_utf8_lossy(h.value).into_owned(),
                    )
                })
                .collect();
            break (r.code.unwrap(), headers, n);
        }
        let n = s.read(&mut tmp).ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&tmp[..n]);
    };
    buf.drain(..head_len);
    let get = |n: &str| headers.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
    let mut body = Vec::new();
    if status == 204 || status == 304 || status < 200 {
        // no body by definition (RFC 9112 §6.3)
    } else if let Some(cl) = get("content-length") {
        let cl: usize = cl.parse().unwrap();
        while buf.len() < cl {
            let n = s.read(&mut tmp).unwrap();
            assert!(n > 0, "EOF inside a Content-Length body");
            buf.extend_from_slice(&tmp[..n]);
        }
        body.extend(buf.drain(..cl));
    } else if get("transfer-encoding").as_deref() == Some("chunked") {
        loop {
            let line_end = loop {
                if let Some(i) = buf.windows(2).position(|w| w == b"\r\n") {
                    break i;
                }
                let n = s.read(&mut tmp).unwrap();
                assert!(n > 0, "EOF inside a chunked body");
                buf.extend_from_slice(&tmp[..n]);
            };
            let size =
                usize::from_str_radix(std::str::from_utf8(&buf[..line_end]).unwrap(), 16).unwrap();
            buf.drain(..line_end + 2);
            while buf.len() < size + 2 {
                let n = s.read(&mut tmp).unwrap();
                assert!(n > 0, "EOF inside a chunk");
                buf.extend_from_slice(&tmp[..n]);
            }
            body.extend_from_slice(&buf[..size]);
            assert_eq!(&buf[size..size + 2], b"\r\n");
            buf.drain(..size + 2);
            if size == 0 {
                break;
            }
        }
    } else {
        body.append(buf);
        loop {
            match s.read(&mut tmp) {
                Ok(0) | Err(_) => break,
                Ok(n) => body.extend_from_slice(&tmp[..n]),
            }
        }
    }
    Some(Response {
        status,
        headers,
        body,
    })
}

/// One request on a fresh connection.
pub fn request(addr: SocketAddr, raw: &[u8]) -> Response {
    let mut s = connect(addr);
    s.write_all(raw).unwrap();
    let mut buf = Vec::new();
    read_response(&mut s, &mut buf).expect("no response")
}

pub fn post(path: &str, body: &str) -> Vec<u8> {
    format!(
        "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

pub fn get(path: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").into_bytes()
}

/// True when the peer closed the connection (reads EOF or reset within the timeout).
pub fn is_closed(s: &mut TcpStream) -> bool {
    s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let mut b = [0u8; 1];
    matches!(s.read(&mut b), Ok(0) | Err(_))
}

/// Concatenate the `delta.content` of an OpenAI SSE transcript; also return the event count.
pub fn sse_content(body: &[u8]) -> (String, usize, bool) {
    let text = String::from_utf8_lossy(body);
    let mut content = String::new();
    let mut n = 0;
    let mut done = false;
    for ev in text.split("\n\n").filter(|e| !e.trim().is_empty()) {
        let data = ev
            .strip_prefix("data: ")
            .unwrap_or_else(|| panic!("bad event {ev:?}"));
        n += 1;
        if data == "[DONE]" {
            done = true;
            continue;
        }
        let v: serde_json::Value = serde_json::from_str(data).unwrap();
        if let Some(c) = v["choices"][0]["delta"]["content"].as_str() {
            content.push_str(c);
        }
    }
    (content, n, done)
}

pub fn metric(addr: SocketAddr, name: &str) -> u64 {
    let r = request(addr, &get("/metrics"));
    r.text()
        .lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// Poll a metric until it equals `want` (the server may still be finishing a previous task).
pub fn wait_metric(addr: SocketAddr, name: &str, want: u64, what: &str) {
    let mut last = 0;
    for _ in 0..50 {
        last = metric(addr, name);
        if last == want {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("{name} = {last}, want {want}: {what}");
}

/// A mock upstream and a gateway in front of it; both are stopped when this drops (also when
/// an assertion fails), gateway first.
pub struct Stack {
    pub addr: SocketAddr,
    gw: Option<Running>,
    mock: Option<MockServer>,
}

impl Stack {
    pub fn new(profile: Profile, driver: &str, extra: &str) -> Stack {
        Stack::with_server(profile, driver, "", extra)
    }

    /// As `new`, with extra lines inside `[server]`.
    pub fn with_server(profile: Profile, driver: &str, server_extra: &str, extra: &str) -> Stack {
        let mock = start_mock(profile, driver);
        let gw = start_gateway_with(mock.addr, driver, server_extra, extra);
        Stack {
            addr: gw.addr,
            gw: Some(gw),
            mock: Some(mock),
        }
    }
}

impl Stack {
    /// A gateway on a whole config text in front of `mock`; `{mock}` in the text is replaced
    /// by the mock's address.
    pub fn with_config(mock: MockServer, config: &str) -> Stack {
        let text = config.replace("{mock}", &mock.addr.to_string());
        let cfg = Config::parse(&text).unwrap_or_else(|e| panic!("{e:?}\n{text}"));
        let gw = gateway::start(cfg).unwrap();
        Stack {
            addr: gw.addr,
            gw: Some(gw),
            mock: Some(mock),
        }
    }
}

impl Stack {
    /// The running gateway (its `spend` ledger, shard count).
    pub fn gateway(&self) -> &Running {
        self.gw.as_ref().expect("running")
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        if let Some(g) = self.gw.take() {
            g.stop();
        }
        if let Some(m) = self.mock.take() {
            m.stop();
        }
    }
}

/// (Fake upstreams.) Read one request (head + Content-Length body) from `s`. None: the peer closed.
pub fn read_request(s: &mut TcpStream) -> Option<Vec<u8>> {
    let mut buf = Vec::new();
    let mut tmp = [0u8; 8192];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        match s.read(&mut tmp) {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&tmp[..n]),
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    let cl: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .map_or(0, |v| v.trim().parse().unwrap());
    while buf.len() < head_end + cl {
        match s.read(&mut tmp) {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&tmp[..n]),
        }
    }
    Some(buf)
}

/// A raw fake upstream: every accepted connection is served on its own thread; for each
/// request read, `answer(stream, n, request)` (n counts requests across connections, from 1)
/// writes whatever it likes and returns whether to keep the connection open.
pub fn fake_upstream<F>(answer: F) -> SocketAddr
where
    F: Fn(&mut TcpStream, usize, &[u8]) -> bool + Send + Sync + 'static,
{
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let answer = Arc::new(answer);
    let count = Arc::new(AtomicUsize::new(0));
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { return };
            let answer = answer.clone();
            let count = count.clone();
            std::thread::spawn(move || {
                while let Some(req) = read_request(&mut s) {
                    let n = count.fetch_add(1, Ordering::SeqCst) + 1;
                    if !answer(&mut s, n, &req) {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// A 200 JSON answer with `body`, head and body in one buffer (one write: two would meet
/// Nagle and a delayed ACK).
pub fn json_response(body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// A connection to `to` from the loopback address `from` (any of 127.0.0.0/8 binds on Linux):
/// a second (third, ...) client address for per-address limits.
pub fn connect_from(from: [u8; 4], to: SocketAddr) -> TcpStream {
    use socket2::{Domain, Socket, Type};
    let s = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    s.bind(&SocketAddr::from((from, 0)).into()).unwrap();
    s.connect(&to.into()).unwrap();
    let s: TcpStream = s.into();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.set_nodelay(true).unwrap();
    s
}

/// One request on a fresh connection from `from` (see [`connect_from`]); `None`: closed or
/// reset without an answer.
pub fn request_from(from: [u8; 4], to: SocketAddr, raw: &[u8]) -> Option<Response> {
    let mut s = connect_from(from, to);
    s.write_all(raw).ok()?;
    read_response(&mut s, &mut Vec::new())
}
