//! The gateway's MCP sessions, process-wide: a session belongs to the process, not a shard,
//! so its next request may arrive on any connection and any core. Each holds the key that
//! opened it (another key's request does not find it), the protocol revision it negotiated,
//! and the upstream sessions opened for it lazily (one per server, with the id that server
//! gave).
//!
//! Bounded: at most `max_sessions` sessions (an `initialize` over it is refused, after expired
//! ones are swept); a session unused for `session_idle_ms` is gone; ids a client presents are
//! at most `MAX_ID` bytes and ids a server gives at most `MAX_UPSTREAM_ID` (longer: not
//! stored). Each session holds at most one upstream entry per configured server (≤ 64).
//!
//! Owns: `Sessions`, session ids (128 random bits, hex) and expiry. Must not: do IO, or hold
//! its lock across an await (every method takes and drops it).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Longest session id a client may present (ours are 32 hex digits).
pub const MAX_ID: usize = 64;
/// Longest session id kept from a server (the spec allows visible ASCII; a longer one is not
/// stored and the server is spoken to without a session).
pub const MAX_UPSTREAM_ID: usize = 256;
/// How often, at most, a create sweeps expired sessions when the table is not full.
const SWEEP_EVERY: Duration = Duration::from_secs(10);

/// An upstream session one gateway session opened with one server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upstream {
    pub server: Box<str>,
    /// The server's URL when it was opened (a reload that moves the server starts over).
    pub url: Box<str>,
    /// The server's `Mcp-Session-Id` (`None`: a stateless server gave none).
    pub id: Option<Box<str>>,
    /// The protocol revision the server answered `initialize` with.
    pub protocol: Box<str>,
}

#[derive(Debug)]
struct Session {
    /// The key that opened it (`None`: keys are off).
    owner: Option<Box<str>>,
    protocol: &'static str,
    last: Instant,
    upstream: Vec<Upstream>,
}

#[derive(Debug)]
struct Table {
    map: HashMap<Box<str>, Session>,
    swept: Instant,
}

/// Why a session was not found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Missing {
    /// Never existed, expired, deleted, or opened by another key.
    NotFound,
    /// Too long or not visible ASCII.
    Malformed,
}

/// Every open MCP session of the process.
#[derive(Debug)]
pub struct Sessions {
    table: Mutex<Table>,
    max: usize,
    idle: Duration,
    rng: ring::rand::SystemRandom,
}

impl Sessions {
    pub fn new(max: usize, idle: Duration) -> Sessions {
        Sessions {
            table: Mutex::new(Table {
                map: HashMap::new(),
                swept: Instant::now(),
            }),
            max: max.max(1),
            idle,
            rng: ring::rand::SystemRandom::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        // a panic elsewhere while holding the lock leaves plain data: keep using it
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new session of `owner`; `None` when the table is full of live sessions.
    pub fn create(
        &self,
        owner: Option<&str>,
        protocol: &'static str,
        now: Instant,
    ) -> Option<String> {
        let mut bytes = [0u8; 16];
        ring::rand::SecureRandom::fill(&self.rng, &mut bytes).ok()?;
        let mut id = String::with_capacity(32);
        for b in bytes {
            id.push(char::from(b"0123456789abcdef"[usize::from(b >> 4)]));
            id.push(char::from(b"0123456789abcdef"[usize::from(b & 15)]));
        }
        let mut t = self.lock();
        if t.map.len() >= self.max || now.saturating_duration_since(t.swept) >= SWEEP_EVERY {
            let idle = self.idle;
            t.map
                .retain(|_, s| now.saturating_duration_since(s.last) < idle);
            t.swept = now;
        }
        if t.map.len() >= self.max {
            return None;
        }
        t.map.insert(
            id.as_str().into(),
            Session {
                owner: owner.map(Into::into),
                protocol,
                last: now,
                upstream: Vec::new(),
            },
        );
        Some(id)
    }

    /// Session `id` of `owner`, marked used now: its protocol revision.
    pub fn touch(
        &self,
        id: &[u8],
        owner: Option<&str>,
        now: Instant,
    ) -> Result<&'static str, Missing> {
        let id = valid(id)?;
        let mut t = self.lock();
        let idle = self.idle;
        let Some(s) = t.map.get_mut(id) else {
            return Err(Missing::NotFound);
        };
        if now.saturating_duration_since(s.last) >= idle {
            t.map.remove(id);
            return Err(Missing::NotFound);
        }
        if s.owner.as_deref() != owner {
            return Err(Missing::NotFound);
        }
        s.last = now;
        Ok(s.protocol)
    }

    /// The upstream session `id` holds with `server` at `url`.
    pub fn upstream(&self, id: &str, server: &str, url: &str) -> Option<Upstream> {
        let t = self.lock();
        let s = t.map.get(id)?;
        s.upstream
            .iter()
            .find(|u| &*u.server == server && &*u.url == url)
            .cloned()
    }

    /// Remember `up` for session `id` (replacing that server's previous one).
    pub fn set_upstream(&self, id: &str, up: Upstream) {
        let mut t = self.lock();
        if let Some(s) = t.map.get_mut(id) {
            s.upstream.retain(|u| u.server != up.server);
            if s.upstream.len() < 64 {
                s.upstream.push(up);
            }
        }
    }

    /// Forget `server`'s upstream session of session `id` (the next call opens a new one).
    pub fn forget_upstream(&self, id: &str, server: &str) {
        let mut t = self.lock();
        if let Some(s) = t.map.get_mut(id) {
            s.upstream.retain(|u| &*u.server != server);
        }
    }

    /// End session `id` of `owner`: its upstream sessions (to close), or why it was not found.
    pub fn remove(&self, id: &[u8], owner: Option<&str>) -> Result<Vec<Upstream>, Missing> {
        let id = valid(id)?;
        let mut t = self.lock();
        match t.map.get(id) {
            Some(s) if s.owner.as_deref() == owner => {}
            _ => return Err(Missing::NotFound),
        }
        Ok(t.map.remove(id).map(|s| s.upstream).unwrap_or_default())
    }

    /// Open sessions (expired ones not yet swept included).
    pub fn len(&self) -> usize {
        self.lock().map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn valid(id: &[u8]) -> Result<&str, Missing> {
    if id.is_empty() || id.len() > MAX_ID || !id.iter().all(|c| c.is_ascii_graphic()) {
        return Err(Missing::Malformed);
    }
    std::str::from_utf8(id).map_err(|_| Missing::Malformed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn up(server: &str) -> Upstream {
        Upstream {
            server: server.into(),
            url: "http://u/mcp".into(),
            id: Some("abc".into()),
            protocol: "2025-06-18".into(),
        }
    }

    #[test]
    fn a_session_belongs_to_its_key_and_expires() {
        let s = Sessions::new(10, Duration::from_secs(60));
        let t0 = Instant::now();
        let id = s.create(Some("a"), "2025-06-18", t0).unwrap();
        assert_eq!(id.len(), 32);
        assert_eq!(s.touch(id.as_bytes(), Some("a"), t0), Ok("2025-06-18"));
        assert_eq!(
            s.touch(id.as_bytes(), Some("b"), t0),
            Err(Missing::NotFound)
        );
        assert_eq!(s.touch(id.as_bytes(), None, t0), Err(Missing::NotFound));
        assert_eq!(s.touch(b"nope", Some("a"), t0), Err(Missing::NotFound));
        assert_eq!(s.touch(&[b'x'; 65], Some("a"), t0), Err(Missing::Malformed));
        assert_eq!(s.touch(b"a\nb", Some("a"), t0), Err(Missing::Malformed));
        let later = t0 + Duration::from_secs(61);
        assert_eq!(
            s.touch(id.as_bytes(), Some("a"), later),
            Err(Missing::NotFound)
        );
        assert!(s.is_empty());
    }

    #[test]
    fn the_table_is_bounded_and_sweeps_expired_sessions() {
        let s = Sessions::new(2, Duration::from_secs(60));
        let t0 = Instant::now();
        let a = s.create(None, "2025-06-18", t0).unwrap();
        s.create(None, "2025-06-18", t0).unwrap();
        assert_eq!(s.create(None, "2025-06-18", t0), None);
        // once the first two are idle past the limit, a create sweeps them
        let later = t0 + Duration::from_secs(61);
        assert!(s.create(None, "2025-06-18", later).is_some());
        assert_eq!(s.len(), 1);
        assert_eq!(s.touch(a.as_bytes(), None, later), Err(Missing::NotFound));
    }

    #[test]
    fn upstream_sessions_are_per_server_and_url() {
        let s = Sessions::new(2, Duration::from_secs(60));
        let id = s.create(None, "2025-06-18", Instant::now()).unwrap();
        s.set_upstream(&id, up("one"));
        s.set_upstream(&id, up("two"));
        assert_eq!(s.upstream(&id, "one", "http://u/mcp"), Some(up("one")));
        assert_eq!(s.upstream(&id, "one", "http://moved/mcp"), None);
        s.forget_upstream(&id, "one");
        assert_eq!(s.upstream(&id, "one", "http://u/mcp"), None);
        assert_eq!(s.remove(id.as_bytes(), Some("k")), Err(Missing::NotFound));
        assert_eq!(s.remove(id.as_bytes(), None), Ok(vec![up("two")]));
        assert!(s.is_empty());
    }
}
