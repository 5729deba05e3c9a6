//! Doctor: the configuration — that it loads and validates (every problem with its line), what
//! `serve` would refuse (exposure rule, TLS files, the state directory by `serve`'s own check),
//! `check`'s warnings, and whether the listen addresses are free.
//!
//! Owns: those checks. Must not: start listeners (a bind probe is closed at once).

use std::net::SocketAddr;

use super::Report;
use crate::config::{Config, ConfigError};

/// The config `serve` would run: `path`, else `RINGGATE_CONFIG`, else the built-in default;
/// with the section title to report it under.
pub fn load(path: Option<&str>) -> (String, Result<Config, Vec<ConfigError>>) {
    let path = path
        .map(str::to_string)
        .or_else(|| std::env::var("RINGGATE_CONFIG").ok());
    match path {
        None => (
            "config (none given: the built-in default)".into(),
            Ok(Config::embedded()),
        ),
        Some(p) => (format!("config {p}"), Config::load(&p)),
    }
}

/// Every load or validation problem, with the line to edit.
pub fn report_errors(r: &mut Report, title: &str, errs: &[ConfigError]) {
    let path = title.strip_prefix("config ").unwrap_or(title);
    for e in errs {
        let fix = match e.line {
            Some(l) => format!("edit {path} line {l}"),
            None => format!("check the path and the file: ringgate check --config {path}"),
        };
        r.problem(e.to_string(), fix);
    }
}

pub fn check(r: &mut Report, cfg: &Config) {
    let tls = cfg.tls_listen_addr().ok().flatten();
    r.ok(format!(
        "valid: {} provider(s), {} model(s), {} key(s); listen {}{}, {}",
        cfg.providers.len(),
        cfg.models.len(),
        cfg.keys.len(),
        cfg.server.listen.get_ref(),
        tls.map(|a| format!(" + TLS {a}")).unwrap_or_default(),
        crate::governance::exposure::summary(cfg),
    ));
    if let Ok(addr) = cfg.listen_addr() {
        if let Err(e) = crate::governance::exposure::check(cfg, addr) {
            r.problem(
                e,
                "add [[key]] entries, listen on 127.0.0.1, or write auth = \"none\" in [server]",
            );
        }
        bind_probe(r, "listen", addr);
    }
    if let (Some(a), Some(c), Some(k)) = (tls, &cfg.server.tls_cert, &cfg.server.tls_key) {
        match crate::http::certs::server_config(c.get_ref().as_ref(), k.get_ref().as_ref()) {
            Ok(_) => r.ok(format!(
                "TLS certificate {} and key {} load (ALPN http/1.1)",
                c.get_ref(),
                k.get_ref()
            )),
            Err(e) => r.problem(
                e,
                "point tls_cert / tls_key at a PEM chain and its key (relative paths: next to the config file)",
            ),
        }
        bind_probe(r, "tls_listen", a);
    }
    state_dir(r, cfg);
    for w in cfg.warnings() {
        let fix = if w.contains("env var") {
            "set it in the gateway's environment (systemd: EnvironmentFile=/etc/ringgate/env)"
        } else {
            "see docs/configuration.md for the field named"
        };
        r.warn(w, fix);
    }
}

/// The state directory `serve` would open, checked as `serve` checks it (`state::check_dir`).
fn state_dir(r: &mut Report, cfg: &Config) {
    if !crate::governance::state::wanted(cfg) {
        return;
    }
    let default = if cfg.server.state_dir.is_none() {
        " (the default for this config file)"
    } else {
        ""
    };
    match crate::governance::state::serve_dir(cfg) {
        Some(dir) => match crate::governance::state::check_dir(&dir) {
            Ok(()) => r.ok(format!("state_dir {}{default} is usable", dir.display())),
            Err(e) => r.problem(
                e,
                "point [server] state_dir at a directory this user can write (created 0700 when missing)",
            ),
        },
        None => r.warn(
            "no state_dir and no HOME or XDG_DATA_HOME: keys made through the admin API and the spend ledger are kept in memory only",
            "write state_dir = \"/var/lib/ringgate\" (or any writable directory) in [server]",
        ),
    }
}

/// Whether `addr` could be bound now (in use: another process, maybe a running ringgate).
fn bind_probe(r: &mut Report, what: &str, addr: SocketAddr) {
    if addr.port() == 0 {
        return;
    }
    match std::net::TcpListener::bind(addr) {
        Ok(_) => r.ok(format!("{what} {addr} is free")),
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => r.warn(
            format!("{what} {addr} is in use (a ringgate already running there is fine)"),
            format!("stop what listens there (ss -ltnp 'sport = :{}') or change {what}", addr.port()),
        ),
        Err(e) => r.problem(
            format!("{what} {addr} cannot be bound: {e}"),
            format!("use an address of this machine for {what} (ports < 1024 need CAP_NET_BIND_SERVICE)"),
        ),
    }
}
