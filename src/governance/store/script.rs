//! The limits script (`limits.lua`) and the calls into it: key names, arguments, and what the
//! replies mean. Every counter change is one atomic script run; a caller first tries
//! `EVALSHA` (the script's SHA-1, computed here and loaded with `SCRIPT LOAD` on connect) and,
//! on a `NOSCRIPT` reply, the same call as `EVAL` with the source.
//!
//! Windows are fixed 60 s windows aligned to wall-clock minutes: window `w` is
//! `unix_ms / 60_000`, and it is part of the key name, so every process that shares the store
//! counts into the same key without asking anyone (their clocks must agree, as NTP makes them;
//! a skew of s seconds moves up to s seconds of requests into the neighbouring window). A
//! window key expires two windows after its last write.
//!
//! Owns: `Op`, `SHA1`, key naming, `Verdict`. Must not: do IO.

use super::resp::{self, Arg, Reply};

/// The script's source.
pub const SOURCE: &str = include_str!("limits.lua");

/// Length of a window.
pub const WINDOW_MS: u64 = 60_000;
/// Lifetime of a window key after its last write.
pub const WINDOW_TTL_MS: u64 = 2 * WINDOW_MS;
/// Lifetime of a key's in-flight hash after its last change (only cleans up keys nobody uses
/// any more: counts of dead instances are dropped by their expired lease, not by this).
pub const IN_FLIGHT_TTL_MS: u64 = 24 * 3600 * 1000;

/// Hex SHA-1 of `SOURCE` (what `EVALSHA` names it by).
pub fn sha1() -> [u8; 40] {
    let d = ring::digest::digest(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY, SOURCE.as_bytes());
    let mut out = [0u8; 40];
    for (i, b) in d.as_ref().iter().enumerate() {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        out[2 * i] = HEX[usize::from(b >> 4)];
        out[2 * i + 1] = HEX[usize::from(b & 15)];
    }
    out
}

/// The wall-clock window of `unix_ms`, and the milliseconds left in it.
pub fn window(unix_ms: u64) -> (u64, u64) {
    (unix_ms / WINDOW_MS, WINDOW_MS - unix_ms % WINDOW_MS)
}

/// Where key names start (`redis_prefix`) and whether a key's name goes in a hash tag
/// (`{<name>}`, on a Cluster: every key of one virtual key then hashes to one slot, so each
/// script call touches one slot).
#[derive(Debug, Clone, Copy)]
pub struct Ns<'a> {
    pub prefix: &'a str,
    pub tag: bool,
}

impl Ns<'_> {
    fn key(&self, what: &str, name: &str, rest: std::fmt::Arguments<'_>) -> Vec<u8> {
        let p = self.prefix;
        match self.tag {
            true => format!("{p}{what}:{{{name}}}{rest}").into_bytes(),
            false => format!("{p}{what}:{name}{rest}").into_bytes(),
        }
    }
}

/// `<prefix>rpm:<name>:<w>` / `<prefix>tpm:<name>:<w>` (`{<name>}` on a Cluster).
pub fn window_key(ns: Ns<'_>, what: &str, name: &str, w: u64) -> Vec<u8> {
    ns.key(what, name, format_args!(":{w}"))
}

/// `<prefix>spend:<name>:<period>:<period start>` (nano-USD spent in a budget period).
pub fn spend_key(ns: Ns<'_>, name: &str, period: &str, start: i64) -> Vec<u8> {
    ns.key("spend", name, format_args!(":{period}:{start}"))
}

/// Lifetime of a spend counter of `period` after its last write (0: forever).
pub fn spend_ttl_ms(period: &str) -> u64 {
    const DAY_MS: u64 = 86_400_000;
    match period {
        "day" => 2 * DAY_MS,
        "month" => 62 * DAY_MS,
        _ => 0,
    }
}

/// `<prefix>inflight:<name>`.
pub fn in_flight_key(ns: Ns<'_>, name: &str) -> Vec<u8> {
    ns.key("inflight", name, format_args!(""))
}

/// `<prefix>live:` (+ instance: the lease key).
pub fn live_prefix(prefix: &str) -> String {
    format!("{prefix}live:")
}

/// One call into the script.
#[derive(Debug, Clone, Copy)]
pub enum Op<'a> {
    /// Head of a request: the key's budget, in-flight and request-rate limits (0: none);
    /// reads the token window too (for the headers).
    Admit {
        rpm_key: &'a [u8],
        tpm_key: &'a [u8],
        hash: &'a [u8],
        spend_key: &'a [u8],
        rpm: u64,
        max_in_flight: u64,
        tpm: u64,
        budget: u64,
    },
    /// Reserve `want` tokens against `limit`.
    Tokens {
        key: &'a [u8],
        limit: u64,
        want: u64,
    },
    /// Lease up to `want` units of a request window (`mode = "leased"`): at most what is left
    /// of `limit`, counted at once.
    Lease {
        key: &'a [u8],
        limit: u64,
        want: u64,
    },
    /// Add to a window or spend counter (negative: give back) that lives `ttl_ms` after.
    Add {
        key: &'a [u8],
        amount: i64,
        ttl_ms: u64,
    },
    /// One of this instance's requests in flight ended.
    Release { hash: &'a [u8] },
    /// This instance has `n` requests in flight (after a reconnect).
    Sync { hash: &'a [u8], n: u64 },
}

impl<'a> Op<'a> {
    /// The first key the call touches (they all share its slot on a Cluster).
    pub fn key(&self) -> &'a [u8] {
        match *self {
            Op::Admit { rpm_key, .. } => rpm_key,
            Op::Tokens { key, .. } | Op::Add { key, .. } | Op::Lease { key, .. } => key,
            Op::Release { hash } | Op::Sync { hash, .. } => hash,
        }
    }
}

/// How the script is named in a call.
#[derive(Debug, Clone, Copy)]
pub enum By<'a> {
    Sha(&'a [u8; 40]),
    Source,
}

/// What the instance and lease look like in calls.
pub struct Ident<'a> {
    pub instance: &'a str,
    pub live_prefix: &'a str,
    /// On a Cluster: the lease in ms (each in-flight hash's own live keys are set; `live_prefix`
    /// is empty). 0 otherwise (one lease key per instance, renewed by the store).
    pub lease_ms: u64,
}

impl Op<'_> {
    /// Append the `EVALSHA`/`EVAL` command for this call.
    pub fn encode(&self, out: &mut Vec<u8>, by: By<'_>, id: &Ident<'_>) {
        let head = match by {
            By::Sha(sha) => [Arg::S("EVALSHA"), Arg::B(sha)],
            By::Source => [Arg::S("EVAL"), Arg::S(SOURCE)],
        };
        // the script's call: its keys (counted), the operation, the operation's arguments
        let call = |out: &mut Vec<u8>, keys: &[Arg<'_>], op: &str, args: &[Arg<'_>]| {
            let n = [Arg::U(keys.len() as u64)];
            resp::command_of(out, &[&head, &n, keys, &[Arg::S(op)], args]);
        };
        let ttl = Arg::U(WINDOW_TTL_MS);
        let hash_ttl = Arg::U(IN_FLIGHT_TTL_MS);
        let (instance, lease_ms) = (Arg::S(id.instance), Arg::U(id.lease_ms));
        match *self {
            Op::Admit {
                rpm_key,
                tpm_key,
                hash,
                spend_key,
                rpm,
                max_in_flight,
                tpm,
                budget,
            } => {
                let keys = [rpm_key, tpm_key, hash, spend_key].map(Arg::B);
                let [rpm, max_in_flight, tpm, budget] =
                    [rpm, max_in_flight, tpm, budget].map(Arg::U);
                let live = Arg::S(id.live_prefix);
                let args = [
                    ttl,
                    rpm,
                    max_in_flight,
                    tpm,
                    instance,
                    live,
                    hash_ttl,
                    budget,
                    lease_ms,
                ];
                call(out, &keys, "admit", &args);
            }
            Op::Tokens { key, limit, want } | Op::Lease { key, limit, want } => {
                let op = if matches!(self, Op::Tokens { .. }) {
                    "tokens"
                } else {
                    "lease"
                };
                call(out, &[Arg::B(key)], op, &[ttl, Arg::U(limit), Arg::U(want)]);
            }
            Op::Add {
                key,
                amount,
                ttl_ms,
            } => call(
                out,
                &[Arg::B(key)],
                "add",
                &[Arg::U(ttl_ms), Arg::I(amount)],
            ),
            Op::Release { hash } => {
                call(out, &[Arg::B(hash)], "release", &[ttl, instance, hash_ttl])
            }
            Op::Sync { hash, n } => {
                let args = [ttl, instance, Arg::U(n), hash_ttl, lease_ms];
                call(out, &[Arg::B(hash)], "sync", &args);
            }
        }
    }
}

/// The script's answer to `Admit` or `Tokens`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    /// 0: admitted / reserved; 1: over the rate (`rpm`, or `tpm` for `Tokens`); 2: over
    /// `max_in_flight`; 3: the budget is spent.
    pub code: i64,
    /// Requests counted in the window (after this one, when admitted).
    pub requests: u64,
    /// Tokens counted in the window (after the reservation, when reserved).
    pub tokens: u64,
    /// Nano-USD spent in the key's budget period (`Admit` with a budget).
    pub spent: u64,
}

impl Verdict {
    /// From an `Admit` reply (`{code, requests, tokens, spent}`).
    pub fn admit(r: &Reply) -> Option<Verdict> {
        match r.ints()?.as_slice() {
            &[code, req, tok, spent] if (0..=3).contains(&code) => Some(Verdict {
                code,
                requests: u64::try_from(req).ok()?,
                tokens: u64::try_from(tok).ok()?,
                spent: u64::try_from(spent).ok()?,
            }),
            _ => None,
        }
    }

    /// From a `Tokens` reply (`{code, tokens}`).
    pub fn tokens(r: &Reply) -> Option<Verdict> {
        match r.ints()?.as_slice() {
            &[code, tok] if (0..=1).contains(&code) => Some(Verdict {
                code,
                requests: 0,
                tokens: u64::try_from(tok).ok()?,
                spent: 0,
            }),
            _ => None,
        }
    }
}

/// The script's answer to `Lease`: units granted, and the window's count after the grant.
pub fn leased(r: &Reply) -> Option<(u64, u64)> {
    match r.ints()?.as_slice() {
        &[granted, counted] => Some((u64::try_from(granted).ok()?, u64::try_from(counted).ok()?)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_are_wall_clock_minutes() {
        assert_eq!(window(0), (0, 60_000));
        assert_eq!(window(1_700_000_039_999), (28_333_333, 1));
        assert_eq!(window(1_700_000_040_000), (28_333_334, 60_000));
        let ns = Ns {
            prefix: "rg:",
            tag: false,
        };
        assert_eq!(
            window_key(ns, "rpm", "team-a", 7),
            b"rg:rpm:team-a:7".to_vec()
        );
        let tagged = Ns { tag: true, ..ns };
        assert_eq!(
            window_key(tagged, "rpm", "team-a", 7),
            b"rg:rpm:{team-a}:7".to_vec()
        );
        assert_eq!(
            spend_key(tagged, "team-a", "day", 86_400),
            b"rg:spend:{team-a}:day:86400".to_vec()
        );
        assert_eq!(
            in_flight_key(tagged, "team-a"),
            b"rg:inflight:{team-a}".to_vec()
        );
        assert_eq!(sha1().len(), 40);
        assert!(sha1().iter().all(u8::is_ascii_hexdigit));
    }

    #[test]
    fn calls_encode_as_evalsha_or_eval() {
        let id = Ident {
            instance: "i-0",
            live_prefix: "rg:live:",
            lease_ms: 0,
        };
        let sha = sha1();
        let mut out = Vec::new();
        Op::Add {
            key: b"k",
            amount: -5,
            ttl_ms: WINDOW_TTL_MS,
        }
        .encode(&mut out, By::Sha(&sha), &id);
        let want = format!(
            "*7\r\n$7\r\nEVALSHA\r\n$40\r\n{}\r\n$1\r\n1\r\n$1\r\nk\r\n$3\r\nadd\r\n$6\r\n120000\r\n$2\r\n-5\r\n",
            std::str::from_utf8(&sha).unwrap()
        );
        assert_eq!(String::from_utf8(out).unwrap(), want);
        let mut out = Vec::new();
        Op::Release { hash: b"h" }.encode(&mut out, By::Source, &id);
        assert!(out.starts_with(b"*8\r\n$4\r\nEVAL\r\n"));
        let r = Reply::Array(Some(vec![
            Reply::Int(1),
            Reply::Int(20),
            Reply::Int(0),
            Reply::Int(7),
        ]));
        assert_eq!(
            Verdict::admit(&r),
            Some(Verdict {
                code: 1,
                requests: 20,
                tokens: 0,
                spent: 7
            })
        );
        assert_eq!(Verdict::tokens(&r), None);
        assert_eq!(leased(&r), None);
        let two = Reply::Array(Some(vec![Reply::Int(3), Reply::Int(17)]));
        assert_eq!(leased(&two), Some((3, 17)));
        let hostile = Reply::Array(Some(vec![Reply::Int(-1), Reply::Int(17)]));
        assert_eq!(leased(&hostile), None);
        let mut out = Vec::new();
        Op::Lease {
            key: b"rg:rpm:{a}:7",
            limit: 20,
            want: 2,
        }
        .encode(&mut out, By::Sha(&sha), &id);
        assert!(out.ends_with(b"$5\r\nlease\r\n$6\r\n120000\r\n$2\r\n20\r\n$1\r\n2\r\n"));
        assert_eq!(Verdict::admit(&Reply::Int(1)), None);
    }
}
