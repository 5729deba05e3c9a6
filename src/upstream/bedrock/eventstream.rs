//! The AWS event-stream binary framing (`application/vnd.amazon.eventstream`), as
//! ConverseStream answers with it: each message is a 12-byte prelude (total length, headers
//! length, both big-endian u32, then the CRC32 of those 8 bytes), the headers (name length u8,
//! name, type u8, value), the payload, and the CRC32 of everything before it. Decoded
//! incrementally from bytes cut anywhere; both CRCs are checked (CRC-32/IEEE, as zlib's).
//!
//! Bounds (botocore's and smithy's): a message is at least 16 bytes and at most 16 MiB
//! ([`MAX_MESSAGE`]); headers at most 128 KiB; a header value of a type the format does not
//! define, a header running past its block, or a bad CRC is an error — the stream cannot be
//! resynchronised after one, so the caller ends it.
//!
//! Owns: `Decoder`, `Frame`, the CRC. Must not: interpret payloads (that is
//! `dialect::converse::stream`) or do IO.

/// Largest message accepted (prelude to message CRC).
pub const MAX_MESSAGE: usize = 16 << 20;
/// Largest header block accepted.
pub const MAX_HEADERS: usize = 128 << 10;
const PRELUDE: usize = 12;
const MIN_MESSAGE: usize = PRELUDE + 4;

/// One decoded message: its `:message-type` (`event`, `exception`, `error`), `:event-type`
/// (or `:exception-type`, or `:error-code`) and payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub message_type: String,
    pub kind: String,
    /// `:error-message` of an `error` message.
    pub error_message: Option<String>,
    pub payload: Vec<u8>,
}

/// Incremental decoder.
#[derive(Debug, Default)]
pub struct Decoder {
    buf: Vec<u8>,
    at: usize,
}

impl Decoder {
    pub fn new() -> Decoder {
        Decoder::default()
    }

    /// Append received bytes.
    pub fn feed(&mut self, bytes: &[u8]) {
        if self.at > 0 && self.at == self.buf.len() {
            self.buf.clear();
            self.at = 0;
        } else if self.at > 64 * 1024 && self.at * 2 > self.buf.len() {
            self.buf.drain(..self.at);
            self.at = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// Bytes received but not yet part of a whole message.
    pub fn pending_bytes(&self) -> usize {
        self.buf.len() - self.at
    }

    /// The next whole message, `Ok(None)` when more bytes are needed, or why the stream is
    /// broken (after which the decoder stays broken: the caller ends the stream).
    pub fn next_frame(&mut self) -> Result<Option<Frame>, String> {
        let rest = self.buf.get(self.at..).unwrap_or_default();
        if rest.len() < PRELUDE {
            return Ok(None);
        }
        let total = be32(rest, 0) as usize;
        let headers_len = be32(rest, 4) as usize;
        if crc32(&rest[..8]) != be32(rest, 8) {
            return Err("event-stream prelude CRC mismatch".into());
        }
        if !(MIN_MESSAGE..=MAX_MESSAGE).contains(&total) {
            return Err(format!("event-stream message length {total} out of bounds"));
        }
        if headers_len > MAX_HEADERS || headers_len > total - MIN_MESSAGE {
            return Err(format!(
                "event-stream headers length {headers_len} out of bounds"
            ));
        }
        if rest.len() < total {
            return Ok(None);
        }
        let msg = &rest[..total];
        if crc32(&msg[..total - 4]) != be32(msg, total - 4) {
            return Err("event-stream message CRC mismatch".into());
        }
        let headers = &msg[PRELUDE..PRELUDE + headers_len];
        let payload = msg[PRELUDE + headers_len..total - 4].to_vec();
        let mut frame = Frame {
            message_type: String::new(),
            kind: String::new(),
            error_message: None,
            payload,
        };
        parse_headers(headers, &mut frame)?;
        self.at += total;
        Ok(Some(frame))
    }
}

fn be32(b: &[u8], at: usize) -> u32 {
    let mut x = [0u8; 4];
    if let Some(s) = b.get(at..at + 4) {
        x.copy_from_slice(s);
    }
    u32::from_be_bytes(x)
}

/// Walk the header block, keeping the string headers the gateway reads.
fn parse_headers(mut h: &[u8], frame: &mut Frame) -> Result<(), String> {
    let short = || "event-stream header runs past its block".to_string();
    while !h.is_empty() {
        let n = h[0] as usize;
        let name = h.get(1..1 + n).ok_or_else(short)?;
        let typ = *h.get(1 + n).ok_or_else(short)?;
        h = &h[2 + n..];
        let fixed = match typ {
            0 | 1 => Some(0),
            2 => Some(1),
            3 => Some(2),
            4 => Some(4),
            5 | 8 => Some(8),
            9 => Some(16),
            6 | 7 => None,
            t => return Err(format!("event-stream header type {t} is not defined")),
        };
        let value = match fixed {
            Some(len) => {
                let v = h.get(..len).ok_or_else(short)?;
                h = &h[len..];
                v
            }
            None => {
                let len = h.get(..2).ok_or_else(short)?;
                let len = u16::from_be_bytes([len[0], len[1]]) as usize;
                let v = h.get(2..2 + len).ok_or_else(short)?;
                h = &h[2 + len..];
                v
            }
        };
        if typ == 7 {
            let text = || String::from_utf8_lossy(value).into_owned();
            match name {
                b":message-type" => frame.message_type = text(),
                b":event-type" | b":exception-type" | b":error-code" => frame.kind = text(),
                b":error-message" => frame.error_message = Some(text()),
                _ => {}
            }
        }
    }
    Ok(())
}

/// CRC-32/IEEE (reflected, polynomial 0xEDB88320), as zlib's `crc32`.
pub fn crc32(data: &[u8]) -> u32 {
    const TABLE: [u32; 256] = table();
    let mut c = !0u32;
    for &b in data {
        c = TABLE[((c ^ b as u32) & 0xff) as usize] ^ (c >> 8);
    }
    !c
}

const fn table() -> [u32; 256] {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 {
                0xEDB8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
            k += 1;
        }
        t[i] = c;
        i += 1;
    }
    t
}

/// Encode one message with string headers (tests, the fuzz seed, fake upstreams).
pub fn encode(headers: &[(&str, &str)], payload: &[u8]) -> Vec<u8> {
    let mut h = Vec::new();
    for (name, value) in headers {
        h.push(name.len() as u8);
        h.extend_from_slice(name.as_bytes());
        h.push(7);
        h.extend_from_slice(&(value.len() as u16).to_be_bytes());
        h.extend_from_slice(value.as_bytes());
    }
    let total = PRELUDE + h.len() + payload.len() + 4;
    let mut out = Vec::with_capacity(total);
    out.extend_from_slice(&(total as u32).to_be_bytes());
    out.extend_from_slice(&(h.len() as u32).to_be_bytes());
    let c = crc32(&out);
    out.extend_from_slice(&c.to_be_bytes());
    out.extend_from_slice(&h);
    out.extend_from_slice(payload);
    let c = crc32(&out);
    out.extend_from_slice(&c.to_be_bytes());
    out
}

/// An event message as Bedrock sends one.
pub fn encode_event(event_type: &str, payload: &[u8]) -> Vec<u8> {
    encode(
        &[
            (":event-type", event_type),
            (":content-type", "application/json"),
            (":message-type", "event"),
        ],
        payload,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc_matches_zlib() {
        assert_eq!(crc32(b""), 0);
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
    }

    #[test]
    fn decodes_at_every_split() {
        let mut wire = encode_event("messageStart", br#"{"role":"assistant"}"#);
        wire.extend(encode(
            &[
                (":message-type", "exception"),
                (":exception-type", "throttlingException"),
            ],
            br#"{"message":"x"}"#,
        ));
        for cut in 0..wire.len() {
            let mut d = Decoder::new();
            let mut got = Vec::new();
            for piece in [&wire[..cut], &wire[cut..]] {
                d.feed(piece);
                while let Some(f) = d.next_frame().unwrap() {
                    got.push(f);
                }
            }
            assert_eq!(got.len(), 2, "cut {cut}");
            assert_eq!(
                (got[0].message_type.as_str(), got[0].kind.as_str()),
                ("event", "messageStart")
            );
            assert_eq!(got[1].kind, "throttlingException");
            assert_eq!(d.pending_bytes(), 0);
        }
    }

    #[test]
    fn refuses_bad_crcs_and_lengths() {
        let good = encode_event("metadata", b"{}");
        for i in [9, 20, good.len() - 1] {
            let mut bad = good.clone();
            bad[i] ^= 1;
            let mut d = Decoder::new();
            d.feed(&bad);
            assert!(d.next_frame().is_err(), "flip at {i}");
        }
        let mut huge = Vec::new();
        huge.extend_from_slice(&(64u32 << 20).to_be_bytes());
        huge.extend_from_slice(&0u32.to_be_bytes());
        let c = crc32(&huge);
        huge.extend_from_slice(&c.to_be_bytes());
        let mut d = Decoder::new();
        d.feed(&huge);
        assert!(d.next_frame().unwrap_err().contains("out of bounds"));
        // a header claiming more bytes than its block has
        let mut h = encode(&[(":event-type", "x")], b"");
        h[12 + 1 + 11 + 1 + 1] = 200; // the value length's low byte
        let n = h.len();
        let c = crc32(&h[..n - 4]);
        h[n - 4..].copy_from_slice(&c.to_be_bytes());
        let mut d = Decoder::new();
        d.feed(&h);
        assert!(d.next_frame().is_err());
    }
}
