//! Config validation: every rule a file must meet before it is served (ports, addresses, TLS
//! files, providers, models, deployments, keys, limits, cache, engines), each problem with its
//! line, and the non-fatal warnings printed at start (and on a reload) and by `ringgate check`.
//!
//! Owns: `Config::validate`, `Config::warnings` and `Config::start_warnings`. Must not: read
//! secrets' values (beyond the admin token's length and whether it is blank, for a
//! non-loopback admin address), touch the network or the file system beyond what a rule names
//! (TLS files exist), or change the config.

use std::ops::Range;

use super::*;
use crate::config::endpoint::Endpoint;
use crate::config::provider::ProviderKind;
use crate::http::target;

impl Config {
    pub(super) fn validate(&self, text: &str) -> Vec<ConfigError> {
        let mut errs = Vec::new();
        let mut err = |span: Range<usize>, message: String| {
            errs.push(ConfigError {
                line: (span.end > 0).then(|| line_of(text, span.start)),
                message,
            });
        };
        if let Err(e) = self.admission.validate() {
            err(0..0, e);
        }
        for (span, e) in cache::validate(self) {
            err(span, e);
        }
        for (span, e) in mcp::validate(self) {
            err(span, e);
        }
        let refs = (self.models.iter().flat_map(|m| m.guardrails.iter()))
            .chain(self.keys.iter().flat_map(|k| k.guardrails.iter()));
        for (span, e) in crate::guardrail::config::validate(&self.guardrails, refs) {
            err(span, e);
        }
        if let Err(e) = self.listen_addr() {
            err(self.server.listen.span(), e);
        }
        if let Err(e) = self.tls_listen_addr() {
            err(
                self.server.tls_listen.as_ref().map_or(0..0, |l| l.span()),
                e,
            );
        }
        let s = &self.server;
        if let Some(l) = &s.tls_listen {
            if s.tls_cert.is_none() || s.tls_key.is_none() {
                err(
                    l.span(),
                    "server.tls_listen needs tls_cert and tls_key (PEM files)".into(),
                );
            }
            if l.get_ref() == s.listen.get_ref() && !l.get_ref().ends_with(":0") {
                err(l.span(), "server.tls_listen must differ from listen".into());
            }
        } else if let Some(f) = s.tls_cert.as_ref().or(s.tls_key.as_ref()) {
            err(f.span(), "server.tls_cert / tls_key are set but tls_listen is not (e.g. tls_listen = \"127.0.0.1:8443\")".into());
        }
        if s.first_request_timeout_ms == 0 {
            err(0..0, "server.first_request_timeout_ms must be > 0".into());
        }
        if s.tls_handshake_timeout_ms == 0 {
            err(0..0, "server.tls_handshake_timeout_ms must be > 0".into());
        }
        if let Some(Err(e)) = self.admin_addr() {
            if let Some(a) = &self.admin {
                err(a.listen.span(), e);
            }
        }
        if let (Some(a), Some(Ok(addr))) = (&self.admin, self.admin_addr()) {
            // a weak token on a non-loopback admin address: refused here too, so a reload
            // (and `check`) says so before a restart would fail (none at all: a warning)
            let raw = std::env::var_os(a.token_env.get_ref()).filter(|v| !v.is_empty());
            let raw = raw
                .as_ref()
                .map(|v| std::os::unix::ffi::OsStrExt::as_bytes(v.as_os_str()));
            if let Some(why) = raw
                .and_then(|r| super::admin_token::weak_token(addr, a.token_env.get_ref(), Some(r)))
            {
                err(a.listen.span(), why);
            }
        }
        if let Some(a) = &self.admin {
            if !routing::is_env_name(a.token_env.get_ref()) {
                err(
                    a.token_env.span(),
                    "admin.token_env must be an env var NAME like RINGGATE_ADMIN_TOKEN, not a token"
                        .into(),
                );
            }
        }
        if self.server.shards == Some(0) || self.server.shards.is_some_and(|s| s > 1024) {
            err(0..0, "server.shards must be between 1 and 1024".into());
        }
        if self.server.idle_spin_us > super::MAX_IDLE_SPIN_US {
            err(
                0..0,
                format!(
                    "server.idle_spin_us must be at most {} (0 = off)",
                    super::MAX_IDLE_SPIN_US
                ),
            );
        }
        if !matches!(
            self.server.driver.get_ref().as_str(),
            "auto" | "io_uring" | "epoll"
        ) {
            err(
                self.server.driver.span(),
                format!(
                    "server.driver {:?}: expected auto, io_uring or epoll",
                    self.server.driver.get_ref()
                ),
            );
        }
        for o in &self.server.cors_allow_origins {
            if let Err(e) = check_origin(o) {
                err(0..0, format!("server.cors_allow_origins: {o:?}: {e}"));
            }
        }
        for h in &self.server.allowed_hosts {
            if h.is_empty()
                || !h
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b))
            {
                err(
                    0..0,
                    format!("server.allowed_hosts: {h:?}: expected a host name without port"),
                );
            }
        }
        for (i, p) in self.providers.iter().enumerate() {
            let name = p.name.get_ref();
            if name.is_empty() {
                err(p.name.span(), "provider name must not be empty".into());
            }
            if self.providers[..i].iter().any(|q| q.name.get_ref() == name) {
                err(p.name.span(), format!("duplicate provider name {name:?}"));
            }
            let kind = *p.kind.get_ref();
            crate::config::cloud::check(p, name, &mut err);
            match (&p.base_url, kind) {
                (None, ProviderKind::Mock | ProviderKind::Bedrock | ProviderKind::Vertex) => {}
                (Some(u), ProviderKind::Mock) => err(
                    u.span(),
                    format!("provider {name:?}: kind mock takes no base_url"),
                ),
                (None, _) => err(
                    p.name.span(),
                    format!("provider {name:?}: base_url is required for kind {kind:?}"),
                ),
                (Some(u), _) => {
                    // The problem shows the URL redacted (`Endpoint::parse`): it must not
                    // repeat a password or a `?key=` secret.
                    if let Err(e) = Endpoint::parse(u.get_ref()) {
                        err(u.span(), format!("provider {name:?}: {e}"));
                    }
                }
            }
            if let Some(env) = &p.api_key_env {
                if !routing::is_env_name(env.get_ref()) {
                    err(
                        env.span(),
                        format!("provider {name:?}: api_key_env must be an env var NAME like OPENAI_API_KEY, not a key"),
                    );
                }
            }
            if let Some(v) = &p.api_version {
                let ok = !v.get_ref().is_empty()
                    && v.get_ref().len() <= 64
                    && v.get_ref()
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'));
                if !ok {
                    err(
                        v.span(),
                        format!(
                            "provider {name:?}: api_version {:?} must be 1 to 64 characters from A-Z a-z 0-9 - . _ (e.g. 2024-10-21)",
                            v.get_ref()
                        ),
                    );
                }
            }
            for q in &p.quirks {
                if q != "no_stream_options" {
                    err(
                        p.name.span(),
                        format!("provider {name:?}: unknown quirk {q:?}"),
                    );
                }
            }
            if let Some(prof) = &p.profile {
                if kind != ProviderKind::Mock {
                    err(
                        prof.span(),
                        format!("provider {name:?}: profile is only for kind mock"),
                    );
                } else if crate::config::provider::Profile::parse(prof.get_ref()).is_none() {
                    err(
                        prof.span(),
                        format!(
                            "provider {name:?}: unknown mock profile {:?}",
                            prof.get_ref()
                        ),
                    );
                }
            }
        }
        for (i, m) in self.models.iter().enumerate() {
            let name = m.name.get_ref();
            if name.is_empty() || name == "*" {
                err(
                    m.name.span(),
                    "model name must not be empty or a bare *".into(),
                );
            }
            if self.models[..i].iter().any(|o| o.name.get_ref() == name) {
                err(m.name.span(), format!("duplicate model name {name:?}"));
            }
            // Client model names and upstream names may become part of an upstream path: they
            // must follow `upstream::target`'s model identifier rule (a name that breaks it
            // could never be requested: clients sending it get a 400).
            let rule = match name.strip_suffix('*') {
                Some(prefix) if !prefix.is_empty() => target::model_prefix(prefix),
                Some(_) => Ok(()),
                None => target::model_id(name),
            };
            if let Err(why) = rule {
                err(
                    m.name.span(),
                    format!("model name {name:?} {why}; {}", target::MODEL_RULE),
                );
            }
            for d in m.deployment_refs() {
                let Some(u) = d.upstream_model else { continue };
                if let Err(why) = target::model_id(u) {
                    err(
                        d.provider.span(),
                        format!(
                            "model {name:?}: upstream_model {u:?} {why}; {}",
                            target::MODEL_RULE
                        ),
                    );
                }
            }
        }
        routing::validate(self, &mut err);
        engines::validate(self, &mut err);
        keys::validate(self, &mut err);
        limits::validate(self, &mut err);
        super::surface::validate(self, &mut err);
        errs
    }

    /// Non-fatal findings for `ringgate check` and `doctor`: `start_warnings`, and an admin
    /// token env var that is not set right now.
    pub fn warnings(&self) -> Vec<String> {
        let mut w = self.start_warnings();
        if let (Some(a), Some(Ok(addr))) = (&self.admin, self.admin_addr()) {
            let env = a.token_env.get_ref();
            let unset = std::env::var_os(env).is_none_or(|v| v.is_empty());
            if unset && !addr.ip().is_loopback() {
                w.push(format!(
                    "admin.listen {addr} is not loopback and {env} is not set here: `ringgate serve` refuses to start without the admin token"
                ));
            } else if unset {
                w.push(format!(
                    "{env} is not set here: without it the admin API answers 401 (only /metrics is served on {addr})"
                ));
            }
        }
        w
    }

    /// What `ringgate serve` logs at start (and a reload when it applies a file): no models,
    /// provider API-key env vars that are not set right now (the variable and the provider,
    /// never a value), admission limits that can never be met, key and limit settings that do
    /// not do what they seem to.
    pub fn start_warnings(&self) -> Vec<String> {
        let shards = self
            .server
            .shards
            .unwrap_or_else(crate::util::cpus::available_cpus);
        let mut w = Vec::new();
        if self.models.is_empty() && !self.reload.allow_empty {
            w.push(
                "the config has no [[model]]: every API request gets 404 until a reload adds one (write `[reload]` with `allow_empty = true` if that is meant)"
                    .to_string(),
            );
        }
        w.extend(self.admission.warnings(shards));
        w.extend(keys::warnings(self));
        w.extend(limits::warnings(self));
        w.extend(super::surface::warnings(self));
        for p in &self.providers {
            let keys = p.key_refs();
            // Unusable: unset, or not a valid header value (`upstream::target`): CR, LF, NUL
            // or other controls would end the header line, so such a key is never sent.
            let unusable: Vec<(&str, String)> = keys
                .iter()
                .filter_map(|&(env, _)| {
                    let problem = match std::env::var(env) {
                        Err(std::env::VarError::NotPresent) => "is not set".to_string(),
                        Err(std::env::VarError::NotUnicode(_)) => "is not UTF-8".to_string(),
                        Ok(v) => format!(
                            "cannot be a header value: it {}",
                            target::header_value(&v).err()?
                        ),
                    };
                    Some((env, problem))
                })
                .collect();
            for (env, problem) in &unusable {
                let effect = if unusable.len() == keys.len() {
                    "requests will go without a key"
                } else {
                    "that key is skipped"
                };
                w.push(format!(
                    "provider {:?}: env var {env} {problem} ({effect})",
                    p.name.get_ref()
                ));
            }
        }
        w
    }
}

/// An allow-list entry: `*`, or a serialized origin `scheme://host[:port]` as browsers send it
/// (no path, no trailing slash).
/// Unless `v` is one of `allowed`: its span and `field "v": expected "a", "b" or "c"`.
pub(super) fn one_of(
    field: &str,
    v: &toml::Spanned<String>,
    allowed: &[&str],
) -> Option<(Range<usize>, String)> {
    if allowed.contains(&v.get_ref().as_str()) {
        return None;
    }
    let quoted: Vec<String> = allowed.iter().map(|a| format!("{a:?}")).collect();
    let expected = match quoted.split_last() {
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => String::new(),
    };
    Some((
        v.span(),
        format!("{field} {:?}: expected {expected}", v.get_ref()),
    ))
}

fn check_origin(o: &str) -> Result<(), &'static str> {
    if o == "*" {
        return Ok(());
    }
    let Some((scheme, host)) = o.split_once("://") else {
        return Err("expected scheme://host[:port], e.g. https://app.example");
    };
    if scheme.is_empty()
        || !scheme
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b))
    {
        return Err("invalid scheme");
    }
    if host.is_empty()
        || host
            .bytes()
            .any(|b| b"/?#@ ".contains(&b) || b.is_ascii_control())
    {
        return Err("an origin has a host and optional port only (no path, no trailing slash)");
    }
    Ok(())
}
