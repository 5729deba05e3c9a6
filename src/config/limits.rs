//! `[limits]`: where the per-key counters (`rpm`, `tpm`, `max_in_flight`) live — in each
//! process (`store = "local"`, one count per key for all its shards) or in a Redis/Valkey shared by a fleet
//! (`store = "redis"`) — and what happens when that store cannot be reached.
//!
//! Owns: `LimitsConfig`, `FleetConfig` (`[fleet] share`), their validation, and `RedisUrl`
//! (parsing `redis[s]://[user][:pass]@host[:port][/db]`; its `Display` never shows the
//! password). Must not: connect anywhere, read the password env var's value or the CA file
//! (only `governance::store` does, once at start), or be consulted on the hot path.

use std::fmt;
use std::ops::Range;

use serde::Deserialize;
use toml::Spanned;

use super::Config;

/// `[limits]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    /// `local` (per process: one count per key for all its shards) | `redis` (one count for every process that
    /// shares the store).
    pub store: Spanned<String>,
    /// For `store = "redis"`: `redis://[user][:password]@host[:port][/db]`. Default
    /// `redis://127.0.0.1:6379/0`.
    pub redis_url: Option<Spanned<String>>,
    /// `local` | `closed`: what to do when the shared store is unreachable or too slow.
    pub on_store_error: Spanned<String>,
    /// How long a request waits for the store's answer before it counts as a store error.
    pub redis_timeout_ms: Spanned<u64>,
    /// Prefix of every key ringgate writes (several fleets can share one Redis).
    pub redis_prefix: Spanned<String>,
    /// In-flight slots of a process that stops renewing its lease (crashed, cut off) are freed
    /// this long after its last renewal.
    pub redis_lease_ms: Spanned<u64>,
    /// An env var holding the Redis password (instead of, or overriding, one in `redis_url`).
    pub redis_password_env: Option<Spanned<String>>,
    /// The ACL user (`AUTH user pass`; instead of, or overriding, one in `redis_url`).
    pub redis_username: Option<Spanned<String>>,
    /// For `rediss://`: a PEM file of the CA(s) that signed the server's certificate (default:
    /// the system roots).
    pub redis_ca_file: Option<Spanned<String>>,
    /// `redis_url` is one seed node of a Redis/Valkey Cluster.
    pub redis_cluster: Spanned<bool>,
    /// `exact` (every decision asks the store) | `leased` (each node leases shares of its keys'
    /// request windows and decides locally: `governance::lease`).
    pub mode: Spanned<String>,
}

/// `[fleet]`: what a fleet keeps in the shared store besides limits and spend.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FleetConfig {
    /// `"keys"` (runtime keys shared through the store, `governance::fleet`), `"responses"`
    /// (stored Responses state shared through the store, `responses_state::remote`).
    pub share: Vec<Spanned<String>>,
    /// This node's name in fleet usage (`GET /admin/usage?scope=fleet`): the key name rule
    /// (letters, digits, `.`, `_`, `-`). Default: the host name. Nodes of one fleet need
    /// distinct names; a node restarted under its name replaces its own rows.
    pub node: Option<Spanned<String>>,
}

impl FleetConfig {
    /// `share` contains `"keys"`.
    pub fn keys(&self) -> bool {
        self.share.iter().any(|s| s.get_ref() == "keys")
    }

    /// This node's name in fleet usage: `node`, else the host name (made to fit the name
    /// rule), else `"node"`.
    pub fn node_name(&self) -> String {
        if let Some(n) = &self.node {
            return n.get_ref().clone();
        }
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        let clean: String = host
            .trim()
            .chars()
            .map(|c| match c.is_ascii_alphanumeric() || "._-".contains(c) {
                true => c,
                false => '-',
            })
            .take(64)
            .collect();
        match super::keys::key_name_ok(&clean) {
            true => clean,
            false => "node".into(),
        }
    }

    /// `share` contains `"responses"`.
    pub fn responses(&self) -> bool {
        self.share.iter().any(|s| s.get_ref() == "responses")
    }
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            store: Spanned::new(0..0, "local".into()),
            redis_url: None,
            on_store_error: Spanned::new(0..0, "local".into()),
            redis_timeout_ms: Spanned::new(0..0, 50),
            redis_prefix: Spanned::new(0..0, "ringgate:".into()),
            redis_lease_ms: Spanned::new(0..0, 30_000),
            redis_password_env: None,
            redis_username: None,
            redis_ca_file: None,
            redis_cluster: Spanned::new(0..0, false),
            mode: Spanned::new(0..0, "exact".into()),
        }
    }
}

/// The default `redis_url`.
pub const DEFAULT_REDIS_URL: &str = "redis://127.0.0.1:6379/0";

impl LimitsConfig {
    /// Whether counters live in Redis.
    pub fn shared(&self) -> bool {
        self.store.get_ref() == "redis"
    }

    /// `on_store_error = "closed"`.
    pub fn closed(&self) -> bool {
        self.on_store_error.get_ref() == "closed"
    }

    /// The parsed `redis_url` (the default when absent), with `redis_username` applied.
    pub fn url(&self) -> Result<RedisUrl, String> {
        let mut u = RedisUrl::parse(
            self.redis_url
                .as_ref()
                .map_or(DEFAULT_REDIS_URL, |u| u.get_ref()),
        )?;
        if let Some(user) = &self.redis_username {
            u.username = Some(user.get_ref().clone());
        }
        Ok(u)
    }

    /// `mode = "leased"`: request windows leased by each node (`governance::lease`).
    pub fn leased(&self) -> bool {
        self.mode.get_ref() == "leased"
    }

    /// `redis_cluster = true`.
    pub fn cluster(&self) -> bool {
        *self.redis_cluster.get_ref()
    }

    /// One phrase for the start-up log (no password).
    pub fn summary(&self) -> String {
        if !self.shared() {
            return "limits local".into();
        }
        match self.url() {
            Ok(u) => {
                format!(
                    "limits redis {u}{} (on_store_error {})",
                    if self.cluster() { " cluster" } else { "" },
                    self.on_store_error.get_ref()
                ) + if self.leased() { ", mode leased" } else { "" }
            }
            Err(_) => "limits redis (bad url)".into(),
        }
    }
}

/// A parsed `redis://` or `rediss://` URL.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisUrl {
    /// `rediss://`: TLS (rustls; the server's certificate is checked against `host`).
    pub tls: bool,
    /// Host name or IP address (IPv6 without brackets).
    pub host: String,
    pub port: u16,
    pub db: u32,
    /// For Redis 6 ACLs (`AUTH user pass`); `None`: `AUTH pass`.
    pub username: Option<String>,
    pub password: Option<String>,
}

impl fmt::Debug for RedisUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RedisUrl({self})")
    }
}

/// `redis[s]://host:port/db`, with `user:***@` / `:***@` when credentials are set: fit to log.
impl fmt::Display for RedisUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.tls { "rediss://" } else { "redis://" })?;
        match (&self.username, &self.password) {
            (Some(u), Some(_)) => write!(f, "{u}:***@")?,
            (Some(u), None) => write!(f, "{u}@")?,
            (None, Some(_)) => f.write_str(":***@")?,
            (None, None) => {}
        }
        if self.host.contains(':') {
            write!(f, "[{}]:{}/{}", self.host, self.port, self.db)
        } else {
            write!(f, "{}:{}/{}", self.host, self.port, self.db)
        }
    }
}

impl RedisUrl {
    /// Parse `redis[s]://[user][:password]@host[:port][/db]` (`valkey[s]://` too). Userinfo
    /// may be percent-encoded. Error messages never repeat the URL (it may hold a password).
    pub fn parse(url: &str) -> Result<RedisUrl, String> {
        let (tls, rest) = if let Some(r) = url.strip_prefix("redis://") {
            (false, r)
        } else if let Some(r) = url.strip_prefix("valkey://") {
            (false, r)
        } else if let Some(r) = url.strip_prefix("rediss://") {
            (true, r)
        } else if let Some(r) = url.strip_prefix("valkeys://") {
            (true, r)
        } else {
            return Err(
                "must start with redis:// or rediss:// (e.g. redis://127.0.0.1:6379/0)".into(),
            );
        };
        if rest.contains(['?', '#']) {
            return Err("query strings and fragments are not supported".into());
        }
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i + 1..]),
            None => (rest, ""),
        };
        let (userinfo, hostport) = match authority.rfind('@') {
            Some(i) => (Some(&authority[..i]), &authority[i + 1..]),
            None => (None, authority),
        };
        let (mut username, mut password) = (None, None);
        if let Some(ui) = userinfo {
            let (u, p) = match ui.split_once(':') {
                Some((u, p)) => (u, Some(p)),
                None => (ui, None),
            };
            if !u.is_empty() {
                username = Some(percent_decode(u).ok_or("bad percent-encoding in the user name")?);
            }
            if let Some(p) = p.filter(|p| !p.is_empty()) {
                password = Some(percent_decode(p).ok_or("bad percent-encoding in the password")?);
            }
            if username.is_some() && password.is_none() {
                // `redis://secret@host` is a common way to give a bare password
                password = username.take();
            }
        }
        let (host, port) = if let Some(v6) = hostport.strip_prefix('[') {
            let (h, after) = v6.split_once(']').ok_or("unclosed [ in the host")?;
            let port = match after {
                "" => None,
                p => Some(p.strip_prefix(':').ok_or("expected :port after ]")?),
            };
            if h.parse::<std::net::Ipv6Addr>().is_err() {
                return Err("not an IPv6 address inside [ ]".into());
            }
            (h, port)
        } else {
            match hostport.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (hostport, None),
            }
        };
        if host.is_empty() {
            return Err("no host".into());
        }
        if !host.contains(':')
            && !host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b))
        {
            return Err("the host may hold letters, digits, '-', '.' and '_' only".into());
        }
        let port = match port {
            None => 6379,
            Some(p) => p
                .parse::<u16>()
                .ok()
                .filter(|&p| p > 0)
                .ok_or("the port must be a number from 1 to 65535")?,
        };
        let db = match path {
            "" => 0,
            p => p
                .parse::<u32>()
                .map_err(|_| "the path must be a database number (e.g. /0)")?,
        };
        Ok(RedisUrl {
            tls,
            host: host.to_string(),
            port,
            db,
            username,
            password,
        })
    }
}

/// `%XX` sequences decoded (UTF-8 required).
fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b.get(i + 1..i + 3)?;
            let hi = (hex[0] as char).to_digit(16)?;
            let lo = (hex[1] as char).to_digit(16)?;
            out.push((hi * 16 + lo) as u8);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

type Sink<'e> = dyn FnMut(Range<usize>, String) + 'e;

pub(super) fn validate(cfg: &Config, err: &mut Sink<'_>) {
    let l = &cfg.limits;
    let one_of = super::validate::one_of;
    let choices = [
        one_of("limits.store", &l.store, &["local", "redis"]),
        one_of(
            "limits.on_store_error",
            &l.on_store_error,
            &["local", "closed"],
        ),
    ];
    for (span, e) in choices.into_iter().flatten() {
        err(span, e);
    }
    if let Some(u) = &l.redis_url {
        if let Err(why) = RedisUrl::parse(u.get_ref()) {
            err(u.span(), format!("limits.redis_url: {why}"));
        }
    }
    let t = *l.redis_timeout_ms.get_ref();
    if !(1..=10_000).contains(&t) {
        err(
            l.redis_timeout_ms.span(),
            "limits.redis_timeout_ms must be from 1 to 10000".into(),
        );
    }
    let lease = *l.redis_lease_ms.get_ref();
    if !(300..=3_600_000).contains(&lease) {
        err(
            l.redis_lease_ms.span(),
            "limits.redis_lease_ms must be from 300 to 3600000".into(),
        );
    }
    let p = l.redis_prefix.get_ref();
    if p.len() > 64 || p.bytes().any(|b| !b.is_ascii_graphic()) {
        err(
            l.redis_prefix.span(),
            "limits.redis_prefix: at most 64 printable characters, no spaces".into(),
        );
    }
    if let Some(e) = &l.redis_password_env {
        if !super::routing::is_env_name(e.get_ref()) {
            err(
                e.span(),
                "limits.redis_password_env must be an env var NAME like REDIS_PASSWORD".into(),
            );
        }
    }
    if let Some(u) = &l.redis_username {
        let v = u.get_ref();
        if v.is_empty() || v.len() > 128 || v.bytes().any(|b| !b.is_ascii_graphic()) {
            err(
                u.span(),
                "limits.redis_username: 1 to 128 printable characters, no spaces".into(),
            );
        }
    }
    if let Some(ca) = &l.redis_ca_file {
        let tls = l.url().is_ok_and(|u| u.tls);
        if !tls {
            err(
                ca.span(),
                "limits.redis_ca_file is for a rediss:// redis_url (TLS)".into(),
            );
        } else if ca.get_ref().is_empty() {
            err(ca.span(), "limits.redis_ca_file is empty".into());
        }
    }
    if l.cluster() && l.url().is_ok_and(|u| u.db != 0) {
        err(
            l.redis_cluster.span(),
            "limits.redis_cluster: a Cluster has database 0 only (redis_url must end in /0 or no path)".into(),
        );
    }
    match l.mode.get_ref().as_str() {
        "exact" => {}
        "leased" if !l.shared() => err(
            l.mode.span(),
            "limits.mode = \"leased\" leases from the shared store: set store = \"redis\"".into(),
        ),
        "leased" => {}
        other => err(
            l.mode.span(),
            format!("limits.mode {other:?}: expected \"exact\" or \"leased\""),
        ),
    }
    if let Some(n) = &cfg.fleet.node {
        if !super::keys::key_name_ok(n.get_ref()) {
            err(
                n.span(),
                "fleet.node: the key name rule (1 to 64 letters, digits, '.', '_', '-')".into(),
            );
        }
    }
    let mut seen: Vec<&str> = Vec::new();
    for s in &cfg.fleet.share {
        match s.get_ref().as_str() {
            v @ ("keys" | "responses") if !l.shared() => err(
                s.span(),
                format!("fleet.share {v:?} needs the shared store: set [limits] store = \"redis\""),
            ),
            "responses" if cfg.responses.store_max_bytes.bytes() == 0 => err(
                s.span(),
                "fleet.share \"responses\" needs the Responses store: [responses] store_max_bytes is 0".into(),
            ),
            v @ ("keys" | "responses") if seen.contains(&v) => {
                err(s.span(), format!("fleet.share lists {v:?} twice"))
            }
            v @ ("keys" | "responses") => seen.push(v),
            other => err(
                s.span(),
                format!("fleet.share {other:?}: expected \"keys\" or \"responses\""),
            ),
        }
    }
}

/// Non-fatal findings: a Redis store configured with no limits to share, a password env var
/// that is not set.
pub(super) fn warnings(cfg: &Config) -> Vec<String> {
    let l = &cfg.limits;
    let mut w = Vec::new();
    if !l.shared() {
        return w;
    }
    if let Some(e) = &l.redis_password_env {
        if std::env::var_os(e.get_ref()).is_none() {
            w.push(format!(
                "limits.redis_password_env: {} is not set",
                e.get_ref()
            ));
        }
    }
    let limited = cfg
        .keys
        .iter()
        .any(|k| k.rpm.is_some() || k.tpm.is_some() || k.max_in_flight.is_some());
    // the store has other users: shared keys or Responses state, the cache's exact layer
    let other_use = !cfg.fleet.share.is_empty() || cfg.cache.redis();
    if !limited && !other_use {
        w.push("limits.store = \"redis\" but no [[key]] has rpm, tpm or max_in_flight".into());
    }
    w
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_and_never_show_the_password() {
        let u = RedisUrl::parse("redis://:s3cr%40t@10.0.0.5:6380/2").unwrap();
        assert_eq!(
            (u.host.as_str(), u.port, u.db),
            ("10.0.0.5", 6380, 2),
            "{u:?}"
        );
        assert_eq!(u.password.as_deref(), Some("s3cr@t"));
        assert_eq!(u.username, None);
        assert_eq!(u.to_string(), "redis://:***@10.0.0.5:6380/2");
        assert!(!format!("{u:?}").contains("s3cr"));
        let u = RedisUrl::parse("redis://app:pw@cache.internal").unwrap();
        assert_eq!(u.to_string(), "redis://app:***@cache.internal:6379/0");
        assert_eq!(u.username.as_deref(), Some("app"));
        let u = RedisUrl::parse("redis://justapassword@[::1]:7000/").unwrap();
        assert_eq!(u.password.as_deref(), Some("justapassword"));
        assert_eq!(u.to_string(), "redis://:***@[::1]:7000/0");
        let u = RedisUrl::parse(DEFAULT_REDIS_URL).unwrap();
        assert_eq!(u.to_string(), DEFAULT_REDIS_URL);
        assert_eq!(
            RedisUrl::parse("valkey://h").unwrap().to_string(),
            "redis://h:6379/0"
        );
        let u = RedisUrl::parse("rediss://ringgate:pw@cache.example:6380/1").unwrap();
        assert!(u.tls);
        assert_eq!(u.to_string(), "rediss://ringgate:***@cache.example:6380/1");
        assert!(RedisUrl::parse("valkeys://h").unwrap().tls);
        assert!(!RedisUrl::parse("redis://h").unwrap().tls);
        for bad in [
            "http://h",
            "redis+tls://:pw@h",
            "redis://:pw@",
            "redis://:pw@h:0",
            "redis://:pw@h:99999",
            "redis://:pw@h/x",
            "redis://:pw@h/0?timeout=1",
            "redis://:p%zz@h",
            "redis://:pw@h st",
            "redis://:pw@[::1",
        ] {
            let e = RedisUrl::parse(bad).unwrap_err();
            assert!(!e.contains("pw"), "{bad}: {e}");
        }
    }

    #[test]
    fn the_contract_parses_and_bad_fields_are_refused_with_lines() {
        let c = Config::parse(
            "[limits]\nstore = \"redis\"\nredis_url = \"redis://127.0.0.1:6379/0\"\non_store_error = \"local\"\n",
        )
        .unwrap();
        assert!(c.limits.shared() && !c.limits.closed());
        assert_eq!(*c.limits.redis_timeout_ms.get_ref(), 50);
        assert_eq!(
            c.limits.summary(),
            "limits redis redis://127.0.0.1:6379/0 (on_store_error local)"
        );
        let errs = Config::parse(
            "[limits]\nstore = \"memcached\"\nredis_url = \"redis://:hunter2@h/x\"\non_store_error = \"open\"\nredis_timeout_ms = 0\nredis_lease_ms = 5\nredis_password_env = \"hunter2!\"\n",
        )
        .unwrap_err();
        let lines: Vec<_> = errs.iter().map(|e| e.line).collect();
        assert_eq!(
            lines,
            [Some(2), Some(4), Some(3), Some(5), Some(6), Some(7)],
            "{errs:?}"
        );
        assert!(errs.iter().all(|e| !e.message.contains("hunter2@")));
    }

    #[test]
    fn the_issue_24_contract_parses() {
        let c = Config::parse(
            "[limits]\nstore = \"redis\"\nredis_url = \"rediss://127.0.0.1:6380/0\"\nredis_ca_file = \"/etc/ringgate/redis-ca.pem\"\nredis_username = \"ringgate\"\nredis_password_env = \"REDIS_PASSWORD\"\nredis_cluster = false\nmode = \"exact\"\n\n[fleet]\nshare = []\n",
        )
        .unwrap();
        let u = c.limits.url().unwrap();
        assert!(u.tls && !c.limits.cluster());
        assert_eq!(u.username.as_deref(), Some("ringgate"));
        assert_eq!(u.to_string(), "rediss://ringgate@127.0.0.1:6380/0");
        // a CA file without TLS, an unknown mode, an unknown share: each on its line
        let errs = Config::parse(
            "[limits]\nstore = \"redis\"\nredis_url = \"redis://h\"\nredis_ca_file = \"ca.pem\"\nmode = \"approx\"\n[fleet]\nshare = [\"everything\"]\n",
        )
        .unwrap_err();
        let lines: Vec<_> = errs.iter().map(|e| e.line).collect();
        assert_eq!(lines, [Some(4), Some(5), Some(7)], "{errs:?}");
        // leased: accepted with the shared store, refused without it
        let c = Config::parse("[limits]\nstore = \"redis\"\nmode = \"leased\"\n").unwrap();
        assert!(c.limits.leased());
        assert!(
            c.limits.summary().ends_with("mode leased"),
            "{}",
            c.limits.summary()
        );
        let errs = Config::parse("[limits]\nmode = \"leased\"\n").unwrap_err();
        assert_eq!(errs[0].line, Some(2), "{errs:?}");
        assert!(errs[0].message.contains("store = \"redis\""), "{errs:?}");
        let c =
            Config::parse("[limits]\nstore = \"redis\"\n[fleet]\nshare = [\"keys\"]\n").unwrap();
        assert!(c.fleet.keys());
        // keys need the shared store; a share listed twice
        let errs = Config::parse("[fleet]\nshare = [\"keys\"]\n").unwrap_err();
        assert!(errs[0].message.contains("store = \"redis\""), "{errs:?}");
        let errs =
            Config::parse("[limits]\nstore = \"redis\"\n[fleet]\nshare = [\"keys\", \"keys\"]\n")
                .unwrap_err();
        assert!(errs[0].message.contains("twice"), "{errs:?}");
        // Responses state: needs the shared store and the Responses store itself
        let c = Config::parse(
            "[limits]\nstore = \"redis\"\n[fleet]\nshare = [\"keys\", \"responses\"]\n",
        )
        .unwrap();
        assert!(c.fleet.keys() && c.fleet.responses());
        let errs = Config::parse("[fleet]\nshare = [\"responses\"]\n").unwrap_err();
        assert!(errs[0].message.contains("store = \"redis\""), "{errs:?}");
        let errs = Config::parse(
            "[limits]\nstore = \"redis\"\n[fleet]\nshare = [\"responses\"]\n[responses]\nstore_max_bytes = 0\n",
        )
        .unwrap_err();
        assert!(errs[0].message.contains("store_max_bytes"), "{errs:?}");
    }

    #[test]
    fn no_limited_key_is_a_warning_only_when_the_store_has_no_other_use() {
        let warns = |text: &str| warnings(&Config::parse(text).unwrap());
        let w = warns("[limits]\nstore = \"redis\"\n");
        assert!(w.iter().any(|w| w.contains("no [[key]] has rpm")), "{w:?}");
        for share in ["keys", "responses"] {
            let w = warns(&format!(
                "[limits]\nstore = \"redis\"\n[fleet]\nshare = [\"{share}\"]\n"
            ));
            assert!(w.is_empty(), "{share}: {w:?}");
        }
    }
}
