//! The governance sections of the config: `[server] auth` and `[[key]]` (virtual keys and their
//! limits), with their validation (`[limits]`, where counters live, is `config::limits`).
//!
//! Owns: `KeyConfig`, `AuthMode` and the rules a key entry must follow (one
//! secret source, hex digests, positive limits, RFC 3339 expiry with an offset).
//! Must not: read secrets' values (a key's secret is named by `key_env`, read once when the
//! gateway starts, see `governance::keyring`), or be consulted on the hot path.

use std::ops::Range;

use serde::Deserialize;
use toml::Spanned;

use super::Config;

/// Whether requests need a virtual key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthMode {
    /// Every API request needs a valid `[[key]]` secret (401 otherwise).
    Keys,
    /// Anyone who reaches the listener may call; refused on a non-loopback listener unless
    /// the config says `auth = "none"` explicitly.
    None,
}

/// One `[[key]]`: a virtual key clients send the way their SDK sends an API key.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyConfig {
    /// What logs, metrics and errors call the key (the secret never appears anywhere).
    pub name: Spanned<String>,
    /// The env var holding the secret (read once at start, only its SHA-256 is kept).
    pub key_env: Option<Spanned<String>>,
    /// Or: the hex SHA-256 of the secret (64 hex digits).
    pub key_sha256: Option<Spanned<String>>,
    /// Model names (or `prefix*` patterns) this key may request. Default: every model.
    pub models: Option<Vec<Spanned<String>>>,
    /// Requests per 60 s window.
    pub rpm: Option<Spanned<u64>>,
    /// Tokens per 60 s window (estimate reserved on the body, reconciled with the answer).
    pub tpm: Option<Spanned<u64>>,
    /// Requests of this key in flight at once.
    pub max_in_flight: Option<Spanned<u64>>,
    /// Spend limit in USD per `budget_period`: once spent, the key's requests get 429
    /// `insufficient_quota` until the next period.
    pub budget_usd: Option<Spanned<f64>>,
    /// `day` | `month` | `total` (UTC calendar periods; default `total`): the budget's period
    /// and the period of the key's ledger rows.
    pub budget_period: Option<Spanned<String>>,
    /// RFC 3339 instant with an offset (a TOML datetime or a string); after it the key is
    /// refused with 401.
    pub expires: Option<Spanned<toml::Value>>,
    /// `false`: the key is refused with 401. Default true.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// `[[guardrail]]` names checked on this key's requests, in addition to the model's.
    #[serde(default)]
    pub guardrails: Vec<Spanned<String>>,
    /// Glob patterns (`*`, `?`) over federated MCP tool names (`server__tool`) this key may
    /// list and call. Absent: every tool; `[]`: none.
    pub mcp_tools: Option<Vec<Spanned<String>>>,
}

fn yes() -> bool {
    true
}

impl KeyConfig {
    /// `expires` as Unix seconds (`Err`: not an RFC 3339 instant with an offset).
    pub fn expires_unix(&self) -> Result<Option<i64>, String> {
        let Some(v) = &self.expires else {
            return Ok(None);
        };
        let dt = match v.get_ref() {
            toml::Value::Datetime(d) => *d,
            toml::Value::String(s) => s
                .parse::<toml::value::Datetime>()
                .map_err(|e| format!("expires {s:?}: {e}"))?,
            other => return Err(format!("expires must be an RFC 3339 time, not {other}")),
        };
        unix_seconds(&dt).map(Some)
    }
}

/// Unix seconds of a full RFC 3339 date-time with an offset.
fn unix_seconds(dt: &toml::value::Datetime) -> Result<i64, String> {
    let (Some(date), Some(time), Some(offset)) = (dt.date, dt.time, dt.offset) else {
        return Err(format!(
            "expires {dt}: needs a date, a time and an offset (e.g. 2026-01-31T23:59:59Z)"
        ));
    };
    let days = crate::util::date::days_from_civil(
        i64::from(date.year),
        i64::from(date.month),
        i64::from(date.day),
    );
    let secs = days * 86_400
        + i64::from(time.hour) * 3600
        + i64::from(time.minute) * 60
        + i64::from(time.second);
    let off = match offset {
        toml::value::Offset::Z => 0,
        toml::value::Offset::Custom { minutes } => i64::from(minutes) * 60,
    };
    Ok(secs - off)
}

type Sink<'e> = dyn FnMut(Range<usize>, String) + 'e;

/// The auth mode the config asks for (`server.auth`, else keys when `[[key]]` entries exist).
pub fn auth_mode(cfg: &Config) -> AuthMode {
    match cfg.server.auth.as_ref().map(|a| a.get_ref().as_str()) {
        Some("none") => AuthMode::None,
        Some(_) => AuthMode::Keys,
        None if cfg.keys.is_empty() => AuthMode::None,
        None => AuthMode::Keys,
    }
}

pub(super) fn validate(cfg: &Config, err: &mut Sink<'_>) {
    if let Some(a) = &cfg.server.auth {
        if let Some((span, e)) = super::validate::one_of("server.auth", a, &["keys", "none"]) {
            err(span, e);
        } else if a.get_ref() == "keys" && cfg.keys.is_empty() && cfg.admin.is_none() {
            err(
                a.span(),
                "server.auth = \"keys\" needs at least one [[key]] (or [admin], to create keys at runtime)".into(),
            );
        }
    }
    for (i, k) in cfg.keys.iter().enumerate() {
        validate_key(cfg, i, k, err);
    }
    for m in &cfg.models {
        let deployments = m.deployments.iter().flat_map(|d| d.get_ref().iter());
        let prices = [(m.price_input_per_mtok, m.price_output_per_mtok)]
            .into_iter()
            .chain(deployments.map(|d| (d.price_input_per_mtok, d.price_output_per_mtok)));
        for (input, output) in prices {
            for (what, p) in [
                ("price_input_per_mtok", input),
                ("price_output_per_mtok", output),
            ] {
                if p.is_some_and(|p| !(p.is_finite() && p >= 0.0)) {
                    err(
                        m.name.span(),
                        format!("model {:?}: {what} must be a number >= 0", m.name.get_ref()),
                    );
                }
            }
        }
    }
}

fn validate_key(cfg: &Config, i: usize, k: &KeyConfig, err: &mut Sink<'_>) {
    let name = k.name.get_ref();
    let who = format!("key {name:?}");
    if let Some(list) = &k.mcp_tools {
        if list.len() > 1024 {
            err(
                k.name.span(),
                format!("{who}: mcp_tools: at most 1024 entries"),
            );
        }
        for p in list {
            if let Err(why) = mcp_tool_pattern(p.get_ref()) {
                err(
                    p.span(),
                    format!("{who}: mcp_tools entry {:?} {why}", p.get_ref()),
                );
            }
        }
    }
    if !key_name_ok(name) {
        err(k.name.span(), format!("{who}: {KEY_NAME_RULE}"));
    }
    if cfg.keys[..i].iter().any(|o| o.name.get_ref() == name) {
        err(k.name.span(), format!("duplicate key name {name:?}"));
    }
    match (&k.key_env, &k.key_sha256) {
        (None, None) => err(
            k.name.span(),
            format!("{who}: give key_env (an env var holding the secret) or key_sha256"),
        ),
        (Some(e), Some(_)) => err(
            e.span(),
            format!("{who}: give key_env or key_sha256, not both"),
        ),
        (Some(e), None) if !super::routing::is_env_name(e.get_ref()) => err(
            e.span(),
            format!("{who}: key_env must be an env var NAME like TEAM_A_KEY, not a key"),
        ),
        (None, Some(h)) if parse_sha256(h.get_ref()).is_none() => err(
            h.span(),
            format!("{who}: key_sha256 must be 64 hex digits (the SHA-256 of the secret)"),
        ),
        _ => {}
    }
    if let (None, Some(h)) = (&k.key_env, &k.key_sha256) {
        let dup = cfg.keys[..i].iter().any(|o| {
            o.key_sha256
                .as_ref()
                .is_some_and(|x| x.get_ref().eq_ignore_ascii_case(h.get_ref()))
        });
        if dup {
            err(
                h.span(),
                format!("{who}: another key has the same key_sha256"),
            );
        }
    }
    for (what, v) in [
        ("rpm", &k.rpm),
        ("tpm", &k.tpm),
        ("max_in_flight", &k.max_in_flight),
    ] {
        if let Some(v) = v {
            if *v.get_ref() == 0 {
                err(
                    v.span(),
                    format!("{who}: {what} must be at least 1 (use enabled = false to stop a key)"),
                );
            }
        }
    }
    if let Some(b) = &k.budget_usd {
        if !(b.get_ref().is_finite() && *b.get_ref() >= 0.0) {
            err(b.span(), format!("{who}: budget_usd must be a number >= 0"));
        }
    }
    if let Some(p) = &k.budget_period {
        if !matches!(p.get_ref().as_str(), "day" | "month" | "total") {
            err(
                p.span(),
                format!(
                    "{who}: budget_period {:?}: expected day, month or total",
                    p.get_ref()
                ),
            );
        }
    }
    if let (Some(e), Err(why)) = (&k.expires, k.expires_unix()) {
        err(e.span(), format!("{who}: {why}"));
    }
    for m in k.models.iter().flatten() {
        let pat = m.get_ref();
        let rule = match pat.strip_suffix('*') {
            Some(prefix) if !prefix.is_empty() => crate::http::target::model_prefix(prefix),
            Some(_) => Ok(()),
            None => crate::http::target::model_id(pat),
        };
        if let Err(why) = rule {
            err(m.span(), format!("{who}: models entry {pat:?} {why}"));
        }
    }
}

/// What a key name may be (config keys and keys made through the admin API alike).
pub const KEY_NAME_RULE: &str = "a key name is 1 to 64 characters from A-Z a-z 0-9 - _ . : @ /";

/// Whether `pat` may be an `mcp_tools` glob: 1–160 characters of a tool name's alphabet
/// (`A-Z a-z 0-9 _ - . /`) and the wildcards `*` and `?`.
pub fn mcp_tool_pattern(pat: &str) -> Result<(), &'static str> {
    if pat.is_empty() || pat.len() > 160 {
        return Err("must be 1-160 characters");
    }
    if !pat
        .bytes()
        .all(|c| c.is_ascii_alphanumeric() || b"_-./*?".contains(&c))
    {
        return Err("may hold only A-Z, a-z, 0-9, _ - . / and the wildcards * ?");
    }
    Ok(())
}

pub fn key_name_ok(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.:@/".contains(&b))
}

/// An RFC 3339 instant with an offset (`2026-01-31T23:59:59Z`) → Unix seconds.
pub fn parse_rfc3339(s: &str) -> Result<i64, String> {
    let dt = s
        .parse::<toml::value::Datetime>()
        .map_err(|e| format!("expires {s:?}: {e}"))?;
    unix_seconds(&dt)
}

/// Why a budget wants `max_in_flight` (`check`, the start-up log and the admin API say it).
pub const UNCAPPED_BUDGET: &str = "budget_usd without max_in_flight: each request reserves its estimated cost (prompt bytes / 4 + max_tokens) while in flight, but a request without max_tokens reserves only its prompt, so many at once can spend past the budget; set max_in_flight to bound them";

/// A 64-hex-digit SHA-256 → its 32 bytes.
pub fn parse_sha256(hex: &str) -> Option<[u8; 32]> {
    let b = hex.as_bytes();
    if b.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, pair) in b.chunks_exact(2).enumerate() {
        let hi = (pair[0] as char).to_digit(16)?;
        let lo = (pair[1] as char).to_digit(16)?;
        out[i] = (hi * 16 + lo) as u8;
    }
    Some(out)
}

/// Non-fatal findings for `ringgate check` and the start-up log: keys whose env var is unset,
/// short secrets, budgets with no prices, budgets without `max_in_flight`.
pub fn warnings(cfg: &Config) -> Vec<String> {
    let mut w = Vec::new();
    if auth_mode(cfg) == AuthMode::None && !cfg.keys.is_empty() {
        w.push("server.auth = \"none\": the [[key]] entries are ignored".into());
    }
    for k in &cfg.keys {
        let who = format!("key {:?}", k.name.get_ref());
        if let Some(env) = &k.key_env {
            match std::env::var(env.get_ref()) {
                Err(_) => w.push(format!(
                    "{who}: env var {} is not set (the key cannot be used)",
                    env.get_ref()
                )),
                Ok(v) if v.len() < 20 => w.push(format!(
                    "{who}: the secret in {} is short ({} characters); use 128 bits of randomness or more",
                    env.get_ref(),
                    v.len()
                )),
                Ok(_) => {}
            }
        }
        if k.budget_usd.is_some() && k.max_in_flight.is_none() {
            w.push(format!("{who}: {UNCAPPED_BUDGET}"));
        }
        if k.budget_usd.is_some() && !cfg.models.iter().any(|m| m.has_price()) {
            w.push(format!(
                "{who}: budget_usd is set but no model has a price (price_input_per_mtok, price_output_per_mtok): nothing is ever spent"
            ));
        }
    }
    w
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_days_and_offsets() {
        assert_eq!(crate::util::date::days_from_civil(1970, 1, 1), 0);
        assert_eq!(crate::util::date::days_from_civil(2000, 3, 1), 11_017);
        let k = |v: &str| {
            let text = format!(
                "[[key]]\nname=\"a\"\nkey_sha256=\"{}\"\nexpires={v}\n",
                "0".repeat(64)
            );
            Config::parse(&text).map(|c| c.keys[0].expires_unix())
        };
        assert_eq!(k("2001-09-09T01:46:40Z").unwrap(), Ok(Some(1_000_000_000)));
        assert_eq!(
            k("\"2001-09-09T03:46:40+02:00\"").unwrap(),
            Ok(Some(1_000_000_000))
        );
        // no offset, no time, not a date: refused with the line
        for bad in ["2001-09-09T01:46:40", "2001-09-09", "\"soon\"", "5"] {
            let errs = k(bad).unwrap_err();
            assert_eq!(errs[0].line, Some(4), "{bad}: {errs:?}");
        }
    }

    #[test]
    fn the_example_file_parses() {
        let c = Config::parse(include_str!("../../examples/keys.toml")).unwrap();
        assert_eq!(c.auth_mode(), AuthMode::Keys);
        let k = &c.keys[0];
        assert_eq!(k.rpm.as_ref().map(|v| *v.get_ref()), Some(60));
        assert_eq!(c.limits.store.get_ref(), "local");
        let errs = Config::parse("[server]\nauth = \"keys\"\n").unwrap_err();
        assert!(errs[0].message.contains("at least one [[key]]"), "{errs:?}");
        let errs =
            Config::parse("[[key]]\nname = \"a\"\nkey_env = \"sk-123\"\nrpm = 0\n").unwrap_err();
        assert_eq!(errs.len(), 2, "{errs:?}");
        assert_eq!((errs[0].line, errs[1].line), (Some(3), Some(4)));
    }

    #[test]
    fn warnings_name_a_budget_without_max_in_flight_and_no_shard_split() {
        let key = |extra: &str| {
            let text = format!(
                "[server]\nshards = 4\n[[key]]\nname = \"a\"\nkey_sha256 = \"{}\"\n{extra}\n",
                "0".repeat(64)
            );
            warnings(&Config::parse(&text).unwrap())
        };
        let w = key("budget_usd = 1.0\nrpm = 1");
        assert!(
            w.iter().any(|w| w.contains("without max_in_flight")),
            "{w:?}"
        );
        assert!(
            !w.iter().any(|w| w.contains("shards")),
            "limits are per key: {w:?}"
        );
        let w = key("budget_usd = 1.0\nmax_in_flight = 4");
        assert!(!w.iter().any(|w| w.contains("max_in_flight")), "{w:?}");
    }

    #[test]
    fn sha256_hex() {
        assert_eq!(parse_sha256(&"ab".repeat(32)), Some([0xab; 32]));
        assert_eq!(parse_sha256(&"AB".repeat(32)), Some([0xab; 32]));
        assert!(parse_sha256(&"ab".repeat(31)).is_none());
        assert!(parse_sha256(&"zz".repeat(32)).is_none());
    }
}
