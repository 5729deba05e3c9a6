//! W3C trace context: the caller's `traceparent` / `tracestate` read (bounded, strict), ids
//! made, and the `traceparent` line an upstream attempt carries.
//!
//! Owns: `Context`, `parse_traceparent`, `Ids`. Must not: allocate but for a caller's
//! `tracestate` (kept only when valid and at most 512 bytes).

use crate::util::rng::Rng;

/// The request's place in a trace.
#[derive(Debug, Clone)]
pub struct Context {
    pub trace_id: [u8; 16],
    /// The gateway's SERVER span.
    pub span_id: [u8; 8],
    /// The caller's span, when a valid `traceparent` came.
    pub parent: Option<[u8; 8]>,
    pub sampled: bool,
    pub state: Option<Box<str>>,
}

/// `traceparent` (`version-traceid-parentid-flags`): (trace id, parent id, sampled). Version
/// `ff`, all-zero ids, uppercase hex and a version-00 value of the wrong length are refused;
/// a later version's extra fields are ignored, as the spec says.
pub fn parse_traceparent(v: &[u8]) -> Option<([u8; 16], [u8; 8], bool)> {
    let v = crate::http::head::trim(v);
    if v.len() < 55 || v[2] != b'-' || v[35] != b'-' || v[52] != b'-' {
        return None;
    }
    let version = hex_byte(&v[0..2])?;
    if version == 0xff || (version == 0 && v.len() != 55) || (v.len() > 55 && v[55] != b'-') {
        return None;
    }
    let mut trace = [0u8; 16];
    for (i, b) in trace.iter_mut().enumerate() {
        *b = hex_byte(&v[3 + 2 * i..5 + 2 * i])?;
    }
    let mut parent = [0u8; 8];
    for (i, b) in parent.iter_mut().enumerate() {
        *b = hex_byte(&v[36 + 2 * i..38 + 2 * i])?;
    }
    let flags = hex_byte(&v[53..55])?;
    if trace == [0; 16] || parent == [0; 8] {
        return None;
    }
    Some((trace, parent, flags & 1 == 1))
}

/// A `tracestate` worth passing on: printable ASCII, at most 512 bytes (the spec's limit).
pub fn valid_tracestate(v: &[u8]) -> Option<Box<str>> {
    let v = crate::http::head::trim(v);
    (!v.is_empty() && v.len() <= 512 && v.iter().all(|&b| (0x20..0x7f).contains(&b)))
        .then(|| String::from_utf8_lossy(v).into())
}

fn hex_byte(h: &[u8]) -> Option<u8> {
    let d = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    Some(d(h[0])? << 4 | d(h[1])?)
}

/// Lowercase hex of `bytes` written to `out` (twice as long).
fn hex_into(out: &mut [u8], bytes: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for (pair, b) in out.chunks_exact_mut(2).zip(bytes) {
        pair[0] = HEX[(b >> 4) as usize];
        pair[1] = HEX[(b & 15) as usize];
    }
}

/// The header lines an upstream attempt carries: `traceparent` naming `span` in `ctx`'s
/// trace (and the caller's `tracestate`). The line is made on the stack and appended once
/// (pushed byte by byte it cost ~1,400 instructions an attempt).
pub fn upstream_lines(out: &mut Vec<u8>, ctx: &Context, span: &[u8; 8]) {
    const LINE: &[u8; 70] =
        b"traceparent: 00-00000000000000000000000000000000-0000000000000000-00\r\n";
    let mut line = *LINE;
    hex_into(&mut line[16..48], &ctx.trace_id);
    hex_into(&mut line[49..65], span);
    if ctx.sampled {
        line[67] = b'1';
    }
    out.extend_from_slice(&line);
    if let Some(s) = &ctx.state {
        out.extend_from_slice(b"tracestate: ");
        out.extend_from_slice(s.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
}

/// A shard's id source: the crate's one PRNG (SplitMix64) seeded from the system's randomness
/// (ids need to be unique, not secret).
#[derive(Debug)]
pub struct Ids(Rng);

impl Ids {
    pub fn new() -> Ids {
        use ring::rand::SecureRandom;
        let mut seed = [0u8; 8];
        let fallback = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0x5eed);
        let seed = match ring::rand::SystemRandom::new().fill(&mut seed) {
            Ok(()) => u64::from_le_bytes(seed),
            Err(_) => fallback ^ (std::process::id() as u64) << 32,
        };
        Ids(Rng::new(seed))
    }

    pub fn next_u64(&self) -> u64 {
        self.0.next_u64()
    }

    /// A non-zero span id.
    pub fn span_id(&self) -> [u8; 8] {
        (self.next_u64() | 1).to_be_bytes()
    }

    pub fn trace_id(&self) -> [u8; 16] {
        let mut t = [0u8; 16];
        t[..8].copy_from_slice(&self.next_u64().to_be_bytes());
        t[8..].copy_from_slice(&(self.next_u64() | 1).to_be_bytes());
        t
    }
}

impl Default for Ids {
    fn default() -> Self {
        Ids::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TP: &[u8] = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn traceparent_strict() {
        let (t, p, s) = parse_traceparent(TP).unwrap();
        assert_eq!(t[0], 0x4b);
        assert_eq!(p[7], 0xb7);
        assert!(s);
        let unsampled = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00";
        assert!(!parse_traceparent(unsampled).unwrap().2);
        for bad in [
            &b"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01"[..],
            b"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            b"00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            b"",
        ] {
            assert!(
                parse_traceparent(bad).is_none(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        // a later version may carry more fields
        assert!(parse_traceparent(
            b"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-later"
        )
        .is_some());
    }

    #[test]
    fn upstream_line_names_the_span() {
        let (trace_id, parent, _) = parse_traceparent(TP).unwrap();
        let ctx = Context {
            trace_id,
            span_id: [1; 8],
            parent: Some(parent),
            sampled: true,
            state: valid_tracestate(b"vendor=1"),
        };
        let mut out = Vec::new();
        upstream_lines(&mut out, &ctx, &[0xab; 8]);
        assert_eq!(
            out,
            b"traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-abababababababab-01\r\ntracestate: vendor=1\r\n"
        );
        assert!(valid_tracestate(b"a\x01").is_none());
        let unsampled = Context {
            sampled: false,
            state: None,
            ..ctx
        };
        let mut out = b"x: y\r\n".to_vec();
        upstream_lines(
            &mut out,
            &unsampled,
            &[0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef],
        );
        assert_eq!(
            out,
            b"x: y\r\ntraceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-0123456789abcdef-00\r\n"
        );
    }
}
