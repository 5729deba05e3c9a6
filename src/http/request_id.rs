//! Request ids: every response carries `x-request-id`. A client's own `x-request-id` is kept
//! when it is 1 to 64 characters from `A-Z a-z 0-9 - _ . :` (UUIDs, ULIDs, trace ids);
//! anything else is replaced. Generated ids are `rg-<shard>-<process tag>-<n>`: the tag (8 hex
//! digits, random per process) keeps ids of different processes and restarts apart, `n`
//! counts the shard's requests. The same id names the request in the access log and in the
//! gateway's log lines about it, and appears in generic upstream errors.
//!
//! Owns: `RequestId` (inline, no allocation), `IdGen` (one per shard). Must not: allocate or
//! format with `fmt` on the request path.

use std::cell::Cell;

/// Longest id kept (client ids longer than this are replaced).
pub const MAX_LEN: usize = 64;

/// One request's id, held inline.
#[derive(Clone, Copy)]
pub struct RequestId {
    buf: [u8; MAX_LEN],
    len: u8,
}

impl Default for RequestId {
    fn default() -> Self {
        RequestId {
            buf: [0; MAX_LEN],
            len: 0,
        }
    }
}

impl std::fmt::Debug for RequestId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl RequestId {
    /// A client-sent value, if it is an acceptable id (see the module doc).
    pub fn from_client(v: &[u8]) -> Option<RequestId> {
        let ok = !v.is_empty()
            && v.len() <= MAX_LEN
            && v.iter()
                .all(|&b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'));
        if !ok {
            return None;
        }
        let mut id = RequestId::default();
        id.buf[..v.len()].copy_from_slice(v);
        id.len = v.len() as u8;
        Some(id)
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[..usize::from(self.len)]
    }

    pub fn as_str(&self) -> &str {
        // Only ASCII is ever stored (checked or generated).
        std::str::from_utf8(self.as_bytes()).unwrap_or_default()
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Append the `x-request-id: <id>` header line.
    pub fn header_line(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"x-request-id: ");
        out.extend_from_slice(self.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
}

/// One shard's id source.
pub struct IdGen {
    /// `rg-<shard>-<tag>-`.
    prefix: [u8; 32],
    prefix_len: usize,
    next: Cell<u64>,
}

impl IdGen {
    /// Ids for shard `shard` of a process whose tag is `tag` (see [`process_tag`]).
    pub fn new(shard: usize, tag: u32) -> IdGen {
        let text = format!("rg-{shard}-{tag:08x}-");
        let mut prefix = [0u8; 32];
        let n = text.len().min(prefix.len());
        prefix[..n].copy_from_slice(&text.as_bytes()[..n]);
        IdGen {
            prefix,
            prefix_len: n,
            next: Cell::new(0),
        }
    }

    /// A fresh id.
    pub fn next(&self) -> RequestId {
        let n = self.next.get() + 1;
        self.next.set(n);
        let mut id = RequestId::default();
        let p = self.prefix_len;
        id.buf[..p].copy_from_slice(&self.prefix[..p]);
        let digits = crate::util::decimal::Digits::new(n);
        let d = digits.as_bytes();
        id.buf[p..p + d.len()].copy_from_slice(d);
        id.len = (p + d.len()) as u8;
        id
    }

    /// The client's id from `sent` when acceptable, else a fresh one.
    pub fn assign(&self, sent: Option<&[u8]>) -> RequestId {
        sent.and_then(RequestId::from_client)
            .unwrap_or_else(|| self.next())
    }
}

/// A random tag for this process (from the OS's random source; the clock if that fails).
pub fn process_tag() -> u32 {
    use ring::rand::SecureRandom;
    let mut b = [0u8; 4];
    if ring::rand::SystemRandom::new().fill(&mut b).is_ok() {
        return u32::from_le_bytes(b);
    }
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    t.subsec_nanos() ^ std::process::id()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_ids_are_kept_only_when_safe() {
        for ok in [
            "a",
            "req_01HZX3",
            "6f1c2a9e-8b7d-4c5f-9e3d-2c1b0a998877",
            "trace:span.1",
        ] {
            assert_eq!(RequestId::from_client(ok.as_bytes()).unwrap().as_str(), ok);
        }
        let long = "x".repeat(MAX_LEN + 1);
        for bad in [
            "",
            "a b",
            "a\"b",
            "a\\b",
            "é",
            "a\r\nx-evil: 1",
            "{}",
            long.as_str(),
        ] {
            assert!(RequestId::from_client(bad.as_bytes()).is_none(), "{bad:?}");
        }
        assert!(RequestId::from_client("x".repeat(MAX_LEN).as_bytes()).is_some());
    }

    #[test]
    fn generated_ids_count_per_shard() {
        let g = IdGen::new(3, 0xabc);
        assert_eq!(g.next().as_str(), "rg-3-00000abc-1");
        assert_eq!(g.next().as_str(), "rg-3-00000abc-2");
        assert_eq!(g.assign(Some(b"mine")).as_str(), "mine");
        assert_eq!(g.assign(Some(b"not mine")).as_str(), "rg-3-00000abc-3");
        assert_eq!(g.assign(None).as_str(), "rg-3-00000abc-4");
        let big = IdGen::new(1023, u32::MAX);
        big.next.set(u64::MAX - 1);
        let id = big.next();
        assert_eq!(id.as_str(), format!("rg-1023-ffffffff-{}", u64::MAX));
        let mut line = Vec::new();
        id.header_line(&mut line);
        assert!(line.starts_with(b"x-request-id: rg-1023-") && line.ends_with(b"\r\n"));
    }
}
