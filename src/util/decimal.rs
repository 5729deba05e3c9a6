//! Decimal integers written without `fmt`: the hot path's response heads and chunk sizes, the
//! access log, rate-limit headers, request ids and the RESP codec all use this one writer.
//!
//! Owns: `Digits` (an unsigned integer's decimal digits on the stack) and `push_u64`. Must not:
//! allocate, or know anything about where the digits go.

/// The decimal digits of a `u64` (at most 20), kept on the stack.
#[derive(Clone, Copy)]
pub struct Digits {
    buf: [u8; 20],
    at: u8,
}

impl Digits {
    pub fn new(mut v: u64) -> Digits {
        let mut buf = [0u8; 20];
        let mut at = buf.len();
        loop {
            at -= 1;
            buf[at] = b'0' + (v % 10) as u8;
            v /= 10;
            if v == 0 {
                break;
            }
        }
        Digits { buf, at: at as u8 }
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[usize::from(self.at)..]
    }

    /// The digits as text (ASCII).
    pub fn as_str(&self) -> &str {
        std::str::from_utf8(self.as_bytes()).unwrap_or("")
    }
}

/// Append `v` in decimal.
pub fn push_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(Digits::new(v).as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_fmt() {
        let mut cases = vec![0, 1, 9, 10, 99, 100, 12_345, u64::from(u32::MAX), u64::MAX];
        cases.extend((0..64).map(|s| 1u64 << s));
        cases.extend((1..20).map(|e| 10u64.pow(e) - 1));
        for v in cases {
            let mut out = b"x".to_vec();
            push_u64(&mut out, v);
            assert_eq!(out, format!("x{v}").into_bytes(), "{v}");
            assert_eq!(Digits::new(v).as_str(), v.to_string());
        }
    }
}
