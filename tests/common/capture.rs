//! A capturing fake upstream: records every request it gets (target, header lines, body) and
//! answers each with a well-formed answer in the dialect its target implies (golden fixtures),
//! plus caller-chosen response header lines. Keep-alive; one thread per connection.
#![allow(dead_code)]

use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::read_request;

/// One request as the upstream saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub target: String,
    /// (name, value) in arrival order, names as sent.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Seen {
    /// Every value of header `name` (case-insensitive).
    pub fn all(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
            .collect()
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.all(name).first().copied()
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "upstream body not JSON ({e}): {}",
                String::from_utf8_lossy(&self.body)
            )
        })
    }
}

pub struct Capture {
    pub addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Capture {
    /// Answers carry `extra` (CRLF-terminated header lines) besides the framing headers.
    pub fn start(extra: &'static str) -> Capture {
        super::quiet_logs();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let rec = seen.clone();
        std::thread::spawn(move || {
            for s in listener.incoming() {
                let Ok(s) = s else { return };
                let rec = rec.clone();
                std::thread::spawn(move || serve(s, &rec, extra));
            }
        });
        Capture { addr, seen }
    }

    /// The `n`-th request (0-based), waiting up to 10 s for it.
    pub fn nth(&self, n: usize) -> Seen {
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(10) {
            if let Some(s) = self.seen.lock().unwrap().get(n) {
                return s.clone();
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        panic!("the capturing upstream never saw request {n}");
    }

    pub fn count(&self) -> usize {
        self.seen.lock().unwrap().len()
    }
}

fn serve(mut s: TcpStream, rec: &Mutex<Vec<Seen>>, extra: &str) {
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    while let Some(raw) = read_request(&mut s) {
        let mut hs = [httparse::EMPTY_HEADER; 64];
        let mut r = httparse::Request::new(&mut hs);
        let Ok(httparse::Status::Complete(n)) = r.parse(&raw) else {
            return;
        };
        let seen = Seen {
            target: r.path.unwrap_or_default().to_string(),
            headers: r
                .headers
                .iter()
                .map(|h| {
                    (
                        h.name.to_string(),
                        String::from_utf8_lossy(h.value).into_owned(),
                    )
                })
                .collect(),
            body: raw[n..].to_vec(),
        };
        let answer = answer(&seen, extra);
        rec.lock().unwrap().push(seen);
        if s.write_all(&answer).is_err() {
            return;
        }
    }
}

fn http(ct: &str, extra: &str, body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 200 OK\r\ncontent-type: {ct}\r\ncontent-length: {}\r\n{extra}\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// A well-formed answer in the dialect `seen.target` implies (streams when asked).
pub fn answer(seen: &Seen, extra: &str) -> Vec<u8> {
    let t = seen.target.as_str();
    let stream = serde_json::from_slice::<serde_json::Value>(&seen.body)
        .ok()
        .and_then(|v| v["stream"].as_bool())
        .unwrap_or(false);
    let sse = |b: &str| http("text/event-stream", extra, b);
    let json = |b: &str| http("application/json", extra, b);
    if t.contains(":streamGenerateContent") {
        sse(include_str!(
            "../golden/stream_gemini_to_messages/text_then_call.in.sse"
        ))
    } else if t.contains(":generateContent") {
        json(include_str!("../golden/response_in_gemini/text.in.json"))
    } else if t.contains(":countTokens") {
        json(r#"{"totalTokens":31}"#)
    } else if t.ends_with("/count_tokens") {
        json(r#"{"input_tokens":3}"#)
    } else if t.ends_with("/v1/messages") && stream {
        sse(include_str!(
            "../golden/stream_messages_to_chat/text_then_tool.in.sse"
        ))
    } else if t.ends_with("/v1/messages") {
        json(include_str!("../golden/response_in_messages/text.in.json"))
    } else if t.contains("/embeddings") {
        json(
            r#"{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.5]}],"model":"m","usage":{"prompt_tokens":1,"total_tokens":1}}"#,
        )
    } else if t.ends_with("/responses") && stream {
        sse(include_str!(
            "../golden/stream_responses_to_chat/text_then_call.in.sse"
        ))
    } else if t.ends_with("/responses") {
        json(include_str!(
            "../golden/response_in_responses/text_and_call.in.json"
        ))
    } else if stream {
        sse(include_str!(
            "../golden/stream_chat_to_gemini/text_then_tool.in.sse"
        ))
    } else {
        json(include_str!(
            "../golden/response_out_messages/length.in.json"
        ))
    }
}
