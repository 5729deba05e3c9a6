//! What the cache keeps of an answer and how it gives it back: `record` turns the bytes a miss
//! wrote to its client (HTTP head and body, JSON or SSE, in the client's dialect) into the
//! stored form — that dialect's non-stream JSON answer — or refuses (an error, a cut or failed
//! stream, a `length` stop unless allowed); `replay` turns a stored answer into the body a hit
//! sends: the JSON as stored, or the SSE stream a live answer in that dialect would carry
//! (through `hub_stream` and `dialect::StreamTranslator`, so translation stays pure and the
//! same code shapes live and replayed streams).
//!
//! Owns: the stored form. Must not: do IO or look anything up. Pure: unit-tested.

use serde_json::Value;

use super::hub_stream::{self, Refusal};
use crate::dialect::{self, Dialect, SseDecoder, SseEvent, StreamTranslator, Usage};

/// A stored answer: the dialect's non-stream JSON and the tokens it reported.
#[derive(Debug, Clone, PartialEq)]
pub struct Stored {
    pub body: Vec<u8>,
    pub usage: Usage,
}

/// The stored form of a complete HTTP response `raw` (head and framed body) in `dialect`, or
/// why it is not kept.
pub fn record(
    raw: &[u8],
    dialect: Dialect,
    model: &str,
    allow_length: bool,
) -> Result<Stored, Refusal> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut resp = httparse::Response::new(&mut headers);
    let head_len = match resp.parse(raw) {
        Ok(httparse::Status::Complete(n)) => n,
        _ => return Err("unparsable head"),
    };
    if resp.code != Some(200) {
        return Err("not a 200 answer");
    }
    let mut chunked = false;
    let mut length = None;
    let mut sse = false;
    for h in resp.headers.iter() {
        if h.name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = h.value.eq_ignore_ascii_case(b"chunked");
        } else if h.name.eq_ignore_ascii_case("content-length") {
            length = std::str::from_utf8(h.value)
                .ok()
                .and_then(|s| s.trim().parse::<usize>().ok());
        } else if h.name.eq_ignore_ascii_case("content-type") {
            sse = memchr::memmem::find(h.value, b"text/event-stream").is_some();
        }
    }
    let rest = raw.get(head_len..).unwrap_or_default();
    let body = if chunked {
        dechunk(rest)?
    } else {
        match length {
            Some(n) if n == rest.len() => rest.to_vec(),
            _ => return Err("incomplete body"),
        }
    };
    let json = if sse {
        stream_to_json(&body, dialect, model)?
    } else {
        body
    };
    let v: Value = serde_json::from_slice(&json).map_err(|_| "not JSON")?;
    complete(&v, dialect, allow_length)?;
    let usage = dialect::response_to_chat(dialect, &json)
        .map(|c| dialect::chat_usage(&c))
        .unwrap_or_default();
    Ok(Stored { body: json, usage })
}

/// A chunked body's payload; refused unless it ends with the last chunk.
fn dechunk(mut b: &[u8]) -> Result<Vec<u8>, Refusal> {
    let mut out = Vec::with_capacity(b.len());
    loop {
        let eol = memchr::memmem::find(b, b"\r\n").ok_or("cut chunk")?;
        let line = std::str::from_utf8(&b[..eol]).map_err(|_| "bad chunk")?;
        let size = usize::from_str_radix(line.split(';').next().unwrap_or("").trim(), 16)
            .map_err(|_| "bad chunk")?;
        b = &b[eol + 2..];
        if size == 0 {
            return Ok(out);
        }
        let data = b.get(..size).ok_or("cut chunk")?;
        out.extend_from_slice(data);
        b = b.get(size + 2..).ok_or("cut chunk")?;
    }
}

/// The data of every event of an SSE body.
fn events(body: &[u8]) -> Vec<SseEvent> {
    let mut d = SseDecoder::new();
    d.feed(body);
    d.finish();
    let mut out = Vec::new();
    while let Some(e) = d.next_event() {
        out.push(e);
    }
    out
}

/// A complete stream in `dialect` as that dialect's non-stream answer (through the hub).
fn stream_to_json(body: &[u8], dialect: Dialect, model: &str) -> Result<Vec<u8>, Refusal> {
    let evs = events(body);
    let hub = if dialect == Dialect::Chat {
        hub_stream::aggregate(evs.iter().map(|e| e.data.as_str()))?
    } else {
        let mut tr = StreamTranslator::new(dialect, Dialect::Chat, model).with_chat_usage(true);
        let mut chat = Vec::new();
        for e in &evs {
            tr.push(e, &mut chat).map_err(|_| "malformed event")?;
        }
        if !tr.is_done() {
            return Err("incomplete stream");
        }
        let chat_evs = events(&chat);
        hub_stream::aggregate(chat_evs.iter().map(|e| e.data.as_str()))?
    };
    if dialect == Dialect::Chat {
        serde_json::to_vec(&hub).map_err(|_| "unencodable")
    } else {
        dialect::chat_to_response(dialect, &hub, model).map_err(|_| "untranslatable")
    }
}

/// Whether a non-stream answer is complete and successful.
fn complete(v: &Value, dialect: Dialect, allow_length: bool) -> Result<(), Refusal> {
    if v.get("error").is_some_and(|e| !e.is_null()) {
        return Err("error answer");
    }
    let s = |k: &str| v.get(k).and_then(Value::as_str);
    match dialect {
        Dialect::Chat => {
            let choices = v
                .get("choices")
                .and_then(Value::as_array)
                .filter(|a| !a.is_empty())
                .ok_or("no choices")?;
            for c in choices {
                match c.get("finish_reason").and_then(Value::as_str) {
                    None => return Err("no finish reason"),
                    Some("length") if !allow_length => return Err("length stop"),
                    Some(_) => {}
                }
            }
            Ok(())
        }
        Dialect::Messages => match (s("type"), s("stop_reason")) {
            (Some("message"), Some("max_tokens")) if !allow_length => Err("length stop"),
            (Some("message"), Some(_)) => Ok(()),
            _ => Err("not a finished message"),
        },
        Dialect::Responses => match s("status") {
            Some("completed") => Ok(()),
            Some("incomplete") if allow_length => Ok(()),
            _ => Err("not a completed response"),
        },
        Dialect::Gemini => Err("not cached"),
    }
}

/// The body a hit sends for a stored answer `stored` in `dialect`: the JSON itself, or (when
/// `stream`) the SSE events a live answer carries; `chat_usage`: a Chat stream client asked for
/// the usage chunk. Returns the body and its content type.
pub fn replay(
    stored: &[u8],
    dialect: Dialect,
    stream: bool,
    model: &str,
    chat_usage: bool,
) -> Result<(Vec<u8>, &'static [u8]), Refusal> {
    if !stream {
        return Ok((stored.to_vec(), b"application/json"));
    }
    let hub = dialect::response_to_chat(dialect, stored).map_err(|_| "untranslatable")?;
    let mut out = Vec::with_capacity(stored.len() * 2 + 256);
    if dialect == Dialect::Chat {
        for c in hub_stream::chunks(&hub, model, chat_usage)? {
            dialect::encode_event(None, &c, &mut out);
        }
        dialect::encode_event(None, "[DONE]", &mut out);
    } else {
        let mut tr = StreamTranslator::new(Dialect::Chat, dialect, model);
        for c in hub_stream::chunks(&hub, model, true)? {
            tr.push(&SseEvent::new(None, &c), &mut out)
                .map_err(|_| "untranslatable")?;
        }
        tr.push(&SseEvent::new(None, "[DONE]"), &mut out)
            .map_err(|_| "untranslatable")?;
        tr.finish(&mut out);
    }
    Ok((out, b"text/event-stream"))
}

#[cfg(test)]
#[path = "answer_tests.rs"]
mod tests;
