//! The running config fit to show (`GET /admin/config`): the file's TOML tree with every
//! secret replaced by `"***"`.
//!
//! Secrets are the values of keys whose name says so (`secret`, `password`, `token`, `api_key`,
//! `sha256`, `credential`, `authorization`, `bearer` — but not the `*_env` names of env vars,
//! which are where secrets live, not secrets), and the userinfo of any URL (`redis://:pw@host`,
//! `https://user:pw@host`) and a `key=` query parameter (`?key=…`). The config file names env
//! vars for its secrets, so most of this is defence against a file that inlines one anyway.
//! `url` is the one URL redactor of the crate (`config::redact_url` is it): config problems,
//! start-up errors, `doctor` and this view all show a URL through it.
//!
//! Owns: `redact`, `url`. Must not: read env vars or files.

use std::borrow::Cow;

use toml::Value;

const MASK: &str = "***";
const SECRET_WORDS: [&str; 8] = [
    "secret",
    "password",
    "token",
    "api_key",
    "sha256",
    "credential",
    "authorization",
    "bearer",
];

/// `v` with its secrets masked (see the module doc).
pub fn redact(v: &Value) -> Value {
    match v {
        Value::Table(t) => Value::Table(
            t.iter()
                .map(|(k, v)| {
                    let v = if secret_key(k) { mask(v) } else { redact(v) };
                    (k.clone(), v)
                })
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(redact).collect()),
        Value::String(s) if s.contains("://") || s.contains("key=") => {
            Value::String(url(s).into_owned())
        }
        other => other.clone(),
    }
}

/// Whether a key's value is a secret by its name (`*_env` names an env var, and `api_keys`
/// lists env var names: not secrets).
fn secret_key(k: &str) -> bool {
    let k = k.to_ascii_lowercase();
    !k.ends_with("_env") && k != "api_keys" && SECRET_WORDS.iter().any(|w| k.contains(w))
}

/// Every string under `v` masked (a secret's value, whatever its shape).
fn mask(v: &Value) -> Value {
    match v {
        Value::Array(a) => Value::Array(a.iter().map(mask).collect()),
        Value::Table(t) => Value::Table(t.iter().map(|(k, v)| (k.clone(), mask(v))).collect()),
        Value::String(_) => Value::String(MASK.into()),
        other => other.clone(),
    }
}

/// `url` fit to display or log: the password of a `user:pass@host` authority becomes `***`
/// (`user:***@host`; userinfo without a colon, often a token, becomes `***@host`), and so do
/// the values of `key=` and secret-named query parameters (`?key=…&alt=sse` →
/// `?key=***&alt=sse`).
pub fn url(url: &str) -> Cow<'_, str> {
    let s = userinfo(url);
    match redact_query(&s) {
        Some(q) => Cow::Owned(q),
        None => s,
    }
}

fn userinfo(url: &str) -> Cow<'_, str> {
    let start = url.find("://").map_or(0, |i| i + 3);
    let rest = &url[start..];
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    let Some(at) = authority.rfind('@') else {
        return Cow::Borrowed(url);
    };
    let user = match authority[..at].split_once(':') {
        Some((user, _)) => user,
        None => "",
    };
    let sep = if user.is_empty() { "" } else { ":" };
    Cow::Owned(format!(
        "{}{user}{sep}{MASK}{}",
        &url[..start],
        &url[start + at..]
    ))
}

/// `key=VALUE` query parameters masked; `None` when nothing needed masking.
fn redact_query(s: &str) -> Option<String> {
    let q = s.find('?')?;
    let (base, query) = s.split_at(q + 1);
    let mut masked = false;
    let parts: Vec<String> = query
        .split('&')
        .map(|p| match p.split_once('=') {
            Some((k, v)) if (secret_key(k) || k.eq_ignore_ascii_case("key")) && v != MASK => {
                masked = true;
                format!("{k}={MASK}")
            }
            _ => p.to_string(),
        })
        .collect();
    masked.then(|| format!("{base}{}", parts.join("&")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_masked_env_var_names_and_the_rest_are_kept() {
        let text = r#"
[admin]
listen = "127.0.0.1:8081"
token_env = "RINGGATE_ADMIN_TOKEN"
token = "inline-admin-token"
[limits]
store = "redis"
redis_url = "redis://user:hunter2@redis.internal:6379/0"
redis_password_env = "REDIS_PW"
[[provider]]
name = "openai"
kind = "openai"
base_url = "https://api.openai.com/v1"
api_key_env = "OPENAI_API_KEY"
api_key = "sk-inline"
api_keys = [{ env = "K2", weight = 2 }]
[[provider]]
name = "g"
kind = "gemini"
base_url = "https://proxy.example/v1beta?key=AIzaSecret&alt=sse"
[[key]]
name = "team"
key_sha256 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
"#;
        let out = toml::to_string(&redact(&text.parse::<Value>().unwrap())).unwrap();
        for secret in [
            "inline-admin-token",
            "hunter2",
            "sk-inline",
            "AIzaSecret",
            "9f86d081884c7d659a2feaa0c55ad015",
        ] {
            assert!(!out.contains(secret), "{secret} leaked:\n{out}");
        }
        for kept in [
            "RINGGATE_ADMIN_TOKEN",
            "REDIS_PW",
            "OPENAI_API_KEY",
            "K2",
            "redis.internal:6379",
            "https://api.openai.com/v1",
            "alt=sse",
            "127.0.0.1:8081",
        ] {
            assert!(out.contains(kept), "{kept} lost:\n{out}");
        }
        assert!(out.contains("user:***@redis.internal"), "{out}");
    }
}
