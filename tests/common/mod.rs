//! Shared helpers for integration tests: start the mock and the gateway on 127.0.0.1 port 0,
//! and a small blocking HTTP/1.1 client that checks framing itself.
//!
//! Every end-to-end test loops over `variants()`: both I/O drivers × `SHARDS` (1 and 2), and
//! the builders take the `Variant`. A test that needs exactly one shard says why with
//! `one_shard(why)`. The builders route the gateway's log through the harness's capture
//! (`quiet_logs`): shown for failing tests only.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ringgate::config::Config;
use ringgate::mock::{fault::Plan, server::MockServer, Profile};
use ringgate::runtime::DriverChoice;
use ringgate::server::{self, Running};

pub mod capture;

pub const DRIVERS: [&str; 2] = ["epoll", "io_uring"];

/// The shard counts every end-to-end test runs at, next to both drivers: one shard, and two so
/// that connections (and the state a request finds) spread over shards.
pub const SHARDS: [usize; 2] = [1, 2];

/// One way to run a test: an I/O driver and a shard count. `Display` names both (for assert
/// messages); `as_ref()` is the driver name (for the mock, which always runs one shard).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Variant {
    pub driver: &'static str,
    pub shards: usize,
}

impl std::fmt::Display for Variant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = if self.shards == 1 { "" } else { "s" };
        write!(f, "{}, {} shard{s}", self.driver, self.shards)
    }
}

impl AsRef<str> for Variant {
    fn as_ref(&self) -> &str {
        self.driver
    }
}

/// Every (driver, shard count) pair: what an end-to-end test loops over
/// (`for v in variants() { Stack::new(profile, v, "") ... }`). Each variant is printed as it
/// starts, so a failing test's captured output names the one that failed.
pub fn variants() -> impl Iterator<Item = Variant> {
    announce(SHARDS.into_iter().flat_map(|shards| {
        DRIVERS
            .into_iter()
            .map(move |driver| Variant { driver, shards })
    }))
}

/// Every shard count with one driver, for a test that picks its driver (a slow one, or one
/// whose subject is not the I/O driver).
pub fn one_driver(driver: &'static str) -> impl Iterator<Item = Variant> {
    announce(
        SHARDS
            .into_iter()
            .map(move |shards| Variant { driver, shards }),
    )
}

/// Every shard count, for a test that leaves the driver to the default; each is printed as it
/// starts.
pub fn shard_counts() -> impl Iterator<Item = usize> {
    quiet_logs();
    SHARDS
        .into_iter()
        .inspect(|n| eprintln!("--- shards = {n}"))
}

/// Both drivers at one shard only, for a test whose meaning needs exactly one shard; `why` says
/// why (it is printed, so a failing test's output shows it). Use sparingly: state that is
/// wrong at two shards is a bug to fix, not a reason to test one.
pub fn one_shard(why: &str) -> impl Iterator<Item = Variant> {
    eprintln!("one shard only: {why}");
    announce(
        DRIVERS
            .into_iter()
            .map(|driver| Variant { driver, shards: 1 }),
    )
}

fn announce(vs: impl Iterator<Item = Variant>) -> impl Iterator<Item = Variant> {
    quiet_logs();
    vs.inspect(|v| eprintln!("--- variant: {v}"))
}

/// Route the library's log lines through `eprint!`, which the test harness captures per test
/// (also from the threads a test starts): a passing test's gateway is quiet, a failing test's
/// output has its gateway's log. Called by every builder here; call it in a test that starts a
/// gateway itself.
pub fn quiet_logs() {
    ringgate::observe::log::set_sink(|line| eprintln!("{line}"));
}

/// `quiet_logs` at the start of every test process that includes this module, before any test
/// runs (an ELF constructor, like the `ctor` crate's): a test that starts a gateway before it
/// calls a builder here — or runs alone in its own process, as under cargo-nextest — is quiet
/// too. A line the gateway logged with no test's capture set still reaches stderr.
#[used]
#[link_section = ".init_array"]
static QUIET_LOGS_AT_START: extern "C" fn() = {
    extern "C" fn quiet_logs_at_start() {
        quiet_logs();
    }
    quiet_logs_at_start
};

/// Whether `id` is a request id the gateway made (`rg-{shard}-{tag}-{n}`) on one of `v`'s
/// shards (which shard a connection lands on is the kernel's choice).
pub fn is_gateway_id(id: &str, v: Variant) -> bool {
    let mut parts = id.split('-');
    parts.next() == Some("rg")
        && parts
            .next()
            .and_then(|s| s.parse::<usize>().ok())
            .is_some_and(|shard| shard < v.shards)
        && parts.next().is_some_and(|t| t.len() == 8)
        && parts.next().is_some_and(|n| n.parse::<u64>().is_ok())
        && parts.next().is_none()
}

pub fn driver_choice(d: impl AsRef<str>) -> DriverChoice {
    if d.as_ref() == "epoll" {
        DriverChoice::Epoll
    } else {
        DriverChoice::IoUring
    }
}

pub fn start_mock(profile: Profile, driver: impl AsRef<str>) -> MockServer {
    quiet_logs();
    ringgate::mock::server::start(
        "127.0.0.1:0".parse().unwrap(),
        profile,
        1,
        driver_choice(driver),
    )
    .unwrap()
}

/// The mock with a per-process fault plan (see `ringgate::mock::fault`).
pub fn start_mock_faulty(profile: Profile, driver: impl AsRef<str>, plan: Plan) -> MockServer {
    quiet_logs();
    ringgate::mock::server::start_with(
        "127.0.0.1:0".parse().unwrap(),
        profile,
        1,
        driver_choice(driver),
        plan,
    )
    .unwrap()
}

/// Gateway in front of `upstream` with `v`'s driver and shard count, with `extra` TOML appended
/// (after the models).
pub fn start_gateway(upstream: SocketAddr, v: Variant, extra: &str) -> Running {
    start_gateway_with(upstream, v, "", extra)
}

/// As `start_gateway`, with extra lines inside `[server]`.
pub fn start_gateway_with(
    upstream: SocketAddr,
    v: Variant,
    server_extra: &str,
    extra: &str,
) -> Running {
    quiet_logs();
    let Variant { driver, shards } = v;
    let text = format!(
        r#"
[server]
listen = "127.0.0.1:0"
shards = {shards}
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
    server::start(cfg).unwrap()
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

/// The sum, in one scrape of `/metrics`, of the series `selector` names: `family` (every series
/// of it) or `family{k="v",...}` (those with a label starting with each of these: `k="v"` is
/// that label, `k=` any value of it; a trailing `{` alone is the family). Summed over shards
/// unless the selector names a `shard`.
///
/// At more than one shard a scrape has the other shards' numbers as they last published them
/// (once a second): assert on counts with `wait_metric` / `metric_until`, not on one scrape.
pub fn metric(addr: SocketAddr, selector: &str) -> u64 {
    metric_in(&request(addr, &get("/metrics")).text(), selector)
}

/// `metric` on a scrape already taken.
pub fn metric_in(scrape: &str, selector: &str) -> u64 {
    let (family, want) = match selector.split_once('{') {
        Some((f, rest)) => (f, rest.trim_end_matches('}')),
        None => (selector, ""),
    };
    let want: Vec<&str> = want.split(',').filter(|w| !w.is_empty()).collect();
    scrape
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (name, labels) = match series.split_once('{') {
                Some((n, rest)) => (n, rest.strip_suffix('}')?),
                None => (series, ""),
            };
            let have: Vec<&str> = labels.split(',').collect();
            (name == family && want.iter().all(|w| have.iter().any(|h| h.starts_with(w))))
                .then(|| value.parse::<u64>().ok())?
        })
        .sum()
}

/// Poll `metric(addr, selector)` until `ok(value)` holds, for up to 10 s (other shards publish
/// once a second; the machine may be busy); returns the value. Panics naming `what` and the
/// last scrape.
pub fn metric_until(addr: SocketAddr, selector: &str, what: &str, ok: impl Fn(u64) -> bool) -> u64 {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let scrape = request(addr, &get("/metrics")).text();
        let v = metric_in(&scrape, selector);
        if ok(v) {
            return v;
        }
        if std::time::Instant::now() > deadline {
            panic!("{selector} = {v}: {what}\n{scrape}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Poll a metric until it equals `want` (the server may still be finishing a previous task, and
/// at more than one shard the others publish once a second).
pub fn wait_metric(addr: SocketAddr, selector: &str, want: u64, what: &str) {
    metric_until(addr, selector, &format!("want {want}: {what}"), |v| {
        v == want
    });
}

/// The `/metrics` text once `ok` holds for it (polling up to 10 s, as `metric_until`).
pub fn scrape_until(addr: SocketAddr, what: &str, ok: impl Fn(&str) -> bool) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let scrape = request(addr, &get("/metrics")).text();
        if ok(&scrape) {
            return scrape;
        }
        if std::time::Instant::now() > deadline {
            panic!("{what}\n{scrape}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A mock upstream and a gateway in front of it; both are stopped when this drops (also when
/// an assertion fails), gateway first.
pub struct Stack {
    pub addr: SocketAddr,
    gw: Option<Running>,
    mock: Option<MockServer>,
}

impl Stack {
    pub fn new(profile: Profile, v: Variant, extra: &str) -> Stack {
        Stack::with_server(profile, v, "", extra)
    }

    /// As `new`, with extra lines inside `[server]`.
    pub fn with_server(profile: Profile, v: Variant, server_extra: &str, extra: &str) -> Stack {
        let mock = start_mock(profile, v);
        let gw = start_gateway_with(mock.addr, v, server_extra, extra);
        Stack {
            addr: gw.addr,
            gw: Some(gw),
            mock: Some(mock),
        }
    }
}

impl Stack {
    /// A gateway on a whole config text in front of `mock`; `{mock}` in the text is replaced
    /// by the mock's address. (The text names its shard count: take it from a `Variant`.)
    pub fn with_config(mock: MockServer, config: &str) -> Stack {
        quiet_logs();
        let text = config.replace("{mock}", &mock.addr.to_string());
        let cfg = Config::parse(&text).unwrap_or_else(|e| panic!("{e:?}\n{text}"));
        let gw = server::start(cfg).unwrap();
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
pub fn read_request<S: Read>(s: &mut S) -> Option<Vec<u8>> {
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
    quiet_logs();
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

/// A key secret's SHA-256 digest in hex, as `[[key]] key_sha256` takes it.
pub fn key_digest_hex(secret: &str) -> String {
    ringgate::governance::keyring::Digest::of(secret.as_bytes())
        .0
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}
