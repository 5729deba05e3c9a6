//! One OTLP `Span` message written straight to its protobuf bytes on the shard: the same
//! field numbers, wire types and field order as `prost` gives `proto::Span` (a test compares
//! the bytes), but attribute keys and values are copied from `&str` into one buffer instead of
//! allocated as a `String` each (a traced request built ~50 small `String`s and two `Vec`s of
//! `KeyValue`s, and the export thread walked them twice to size and write them, then freed
//! them). The export thread only frames these bytes into its batch (`export`).
//!
//! Owns: `SpanWriter`, `frame`. Must not: allocate beyond its one buffer, or hold logic about
//! which attributes a span has (that is `span`'s).

use crate::util::decimal::Digits;

/// Appends `v` as a protobuf varint.
pub fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn varint_len(v: u64) -> usize {
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

/// A length-delimited field `tag` holding `body` (the field's key, length, bytes).
pub fn frame(out: &mut Vec<u8>, tag: u32, body: &[u8]) {
    field(out, tag, body.len());
    out.extend_from_slice(body);
}

/// The key and length of a length-delimited field `tag` of `len` bytes, which follow.
pub fn field(out: &mut Vec<u8>, tag: u32, len: usize) {
    varint(out, u64::from(tag << 3 | 2));
    varint(out, len as u64);
}

/// The bytes `frame` writes for a body of `len` bytes under a tag below 16.
pub fn framed_len(len: usize) -> usize {
    1 + varint_len(len as u64) + len
}

/// A span's fields in tag order: `start` (1–8), `attr*` (9), `finish` (15, 16).
pub struct SpanWriter {
    buf: Vec<u8>,
}

/// Field keys (`tag << 3 | wire type`) of `Span`, `KeyValue` and `AnyValue`.
const TRACE_ID: u8 = 0x0a;
const SPAN_ID: u8 = 0x12;
const TRACE_STATE: u8 = 0x1a;
const PARENT: u8 = 0x22;
const NAME: u8 = 0x2a;
const KIND: u8 = 0x30;
const START: u8 = 0x39;
const END: u8 = 0x41;
const ATTR: u8 = 0x4a;
const STATUS: u8 = 0x7a;
const FLAGS: [u8; 2] = [0x85, 0x01];
const KEY: u8 = 0x0a;
const VALUE: u8 = 0x12;
const STRING: u8 = 0x0a;
const INT: u8 = 0x18;
const DOUBLE: u8 = 0x21;
const ARRAY: u8 = 0x2a;
const ARRAY_VALUES: u8 = 0x0a;

/// The ids and times a span starts with (`parent` and `state` empty when there are none).
pub struct Head<'a> {
    pub trace_id: &'a [u8; 16],
    pub span_id: &'a [u8; 8],
    pub state: &'a str,
    pub parent: Option<&'a [u8; 8]>,
    /// The name's pieces, joined by one space (`["chat", "gpt-4o-mini"]`; empty pieces and
    /// their space are left out).
    pub name: &'a [&'a str],
    pub kind: i32,
    pub start: u64,
    pub end: u64,
}

impl SpanWriter {
    pub fn start(h: &Head<'_>, capacity: usize) -> SpanWriter {
        let mut buf = Vec::with_capacity(capacity);
        buf.push(TRACE_ID);
        buf.push(16);
        buf.extend_from_slice(h.trace_id);
        buf.push(SPAN_ID);
        buf.push(8);
        buf.extend_from_slice(h.span_id);
        if !h.state.is_empty() {
            buf.push(TRACE_STATE);
            varint(&mut buf, h.state.len() as u64);
            buf.extend_from_slice(h.state.as_bytes());
        }
        if let Some(p) = h.parent {
            buf.push(PARENT);
            buf.push(8);
            buf.extend_from_slice(p);
        }
        let mut parts = h.name.iter().filter(|p| !p.is_empty());
        let len: usize = h
            .name
            .iter()
            .filter(|p| !p.is_empty())
            .map(|p| p.len() + 1)
            .sum();
        if len > 0 {
            buf.push(NAME);
            varint(&mut buf, (len - 1) as u64);
            if let Some(first) = parts.next() {
                buf.extend_from_slice(first.as_bytes());
            }
            for p in parts {
                buf.push(b' ');
                buf.extend_from_slice(p.as_bytes());
            }
        }
        if h.kind != 0 {
            buf.push(KIND);
            varint(&mut buf, h.kind as u64);
        }
        if h.start != 0 {
            buf.push(START);
            buf.extend_from_slice(&h.start.to_le_bytes());
        }
        if h.end != 0 {
            buf.push(END);
            buf.extend_from_slice(&h.end.to_le_bytes());
        }
        SpanWriter { buf }
    }

    /// A `KeyValue` whose `AnyValue` is `value_len` bytes, then `value` writes them.
    fn attr(&mut self, key: &str, value_len: usize, value: impl FnOnce(&mut Vec<u8>)) {
        let kv_len = 1
            + varint_len(key.len() as u64)
            + key.len()
            + 1
            + varint_len(value_len as u64)
            + value_len;
        let b = &mut self.buf;
        b.push(ATTR);
        varint(b, kv_len as u64);
        b.push(KEY);
        varint(b, key.len() as u64);
        b.extend_from_slice(key.as_bytes());
        b.push(VALUE);
        varint(b, value_len as u64);
        value(b);
    }

    pub fn str(&mut self, key: &str, v: &str) {
        let len = 1 + varint_len(v.len() as u64) + v.len();
        self.attr(key, len, |b| {
            b.push(STRING);
            varint(b, v.len() as u64);
            b.extend_from_slice(v.as_bytes());
        });
    }

    pub fn int(&mut self, key: &str, v: i64) {
        self.attr(key, 1 + varint_len(v as u64), |b| {
            b.push(INT);
            varint(b, v as u64);
        });
    }

    /// An unsigned count, saturated at `i64::MAX`.
    pub fn uint(&mut self, key: &str, v: u64) {
        self.int(key, v.min(i64::MAX as u64) as i64);
    }

    pub fn double(&mut self, key: &str, v: f64) {
        self.attr(key, 9, |b| {
            b.push(DOUBLE);
            b.extend_from_slice(&v.to_le_bytes());
        });
    }

    /// A status code as `error.type`'s string value, without formatting it into a `String`.
    pub fn code(&mut self, key: &str, status: u16) {
        let digits = Digits::new(u64::from(status));
        self.str(key, digits.as_str());
    }

    /// An array of strings.
    pub fn strs<S: AsRef<str>>(&mut self, key: &str, values: &[S]) {
        let one = |s: &str| 1 + varint_len(s.len() as u64) + s.len();
        let inner: usize = values
            .iter()
            .map(|s| {
                let n = one(s.as_ref());
                1 + varint_len(n as u64) + n
            })
            .sum();
        self.attr(key, 1 + varint_len(inner as u64) + inner, |b| {
            b.push(ARRAY);
            varint(b, inner as u64);
            for s in values {
                let s = s.as_ref();
                b.push(ARRAY_VALUES);
                varint(b, one(s) as u64);
                b.push(STRING);
                varint(b, s.len() as u64);
                b.extend_from_slice(s.as_bytes());
            }
        });
    }

    /// The status (ERROR when `error`) and the W3C flags; the span's bytes.
    pub fn finish(mut self, error: bool, flags: u32) -> Vec<u8> {
        if error {
            // Status { code: 2 (ERROR) }; an empty message is left out, as prost does
            self.buf.extend_from_slice(&[STATUS, 2, 0x18, 2]);
        }
        if flags != 0 {
            self.buf.extend_from_slice(&FLAGS);
            self.buf.extend_from_slice(&flags.to_le_bytes());
        }
        self.buf
    }
}

#[cfg(test)]
mod tests {
    use super::super::proto::{self, KeyValue, Value};
    use super::*;
    use prost::Message;

    #[test]
    fn the_same_bytes_as_prost() {
        for (parent, state, error) in [(None, "", false), (Some([7u8; 8]), "a=b", true)] {
            let reasons = ["stop".to_string(), "length".to_string()];
            let mut w = SpanWriter::start(
                &Head {
                    trace_id: &[1; 16],
                    span_id: &[2; 8],
                    state,
                    parent: parent.as_ref(),
                    name: &["chat", "gpt-4o-mini"],
                    kind: proto::KIND_SERVER,
                    start: 1_700_000_000_000_000_000,
                    end: 1_700_000_000_000_100_000,
                },
                64,
            );
            w.str("gen_ai.operation.name", "chat");
            w.str("long", &"x".repeat(300));
            w.int("neg", -3);
            w.uint("big", u64::MAX);
            w.int("http.response.status_code", 200);
            w.double("t", 0.25);
            w.code("error.type", 503);
            w.code("zero", 0);
            w.strs("gen_ai.response.finish_reasons", &reasons);
            let ours = w.finish(error, 0x301);
            let s = |v: &str| Value::String(v.to_string());
            let theirs = proto::Span {
                trace_id: vec![1; 16],
                span_id: vec![2; 8],
                trace_state: state.into(),
                parent_span_id: parent.map(|p| p.to_vec()).unwrap_or_default(),
                name: "chat gpt-4o-mini".into(),
                kind: proto::KIND_SERVER,
                start_time_unix_nano: 1_700_000_000_000_000_000,
                end_time_unix_nano: 1_700_000_000_000_100_000,
                attributes: vec![
                    KeyValue::new("gen_ai.operation.name", s("chat")),
                    KeyValue::new("long", s(&"x".repeat(300))),
                    KeyValue::new("neg", Value::Int(-3)),
                    KeyValue::new("big", Value::Int(i64::MAX)),
                    KeyValue::new("http.response.status_code", Value::Int(200)),
                    KeyValue::new("t", Value::Double(0.25)),
                    KeyValue::new("error.type", s("503")),
                    KeyValue::new("zero", s("0")),
                    KeyValue::new(
                        "gen_ai.response.finish_reasons",
                        Value::Array(proto::ArrayValue {
                            values: reasons
                                .iter()
                                .map(|r| proto::AnyValue { value: Some(s(r)) })
                                .collect(),
                        }),
                    ),
                ],
                status: error.then(|| proto::Status {
                    message: String::new(),
                    code: proto::STATUS_ERROR,
                }),
                flags: 0x301,
            }
            .encode_to_vec();
            assert_eq!(ours, theirs);
        }
        let mut w = SpanWriter::start(
            &Head {
                trace_id: &[1; 16],
                span_id: &[2; 8],
                state: "",
                parent: None,
                name: &["chat", ""],
                kind: proto::KIND_CLIENT,
                start: 1,
                end: 2,
            },
            0,
        );
        w.strs::<&str>("empty", &[]);
        let theirs = proto::Span {
            trace_id: vec![1; 16],
            span_id: vec![2; 8],
            name: "chat".into(),
            kind: proto::KIND_CLIENT,
            start_time_unix_nano: 1,
            end_time_unix_nano: 2,
            attributes: vec![KeyValue::new(
                "empty",
                Value::Array(proto::ArrayValue { values: vec![] }),
            )],
            ..Default::default()
        };
        assert_eq!(w.finish(false, 0), theirs.encode_to_vec());
    }
}
