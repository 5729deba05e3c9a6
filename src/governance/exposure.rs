//! Secure by default: who may reach the listener decides whether keys are required. A
//! loopback listener without keys serves anyone on the machine (the quick start); any other
//! address without keys would let anyone who can reach it spend the provider keys, so the
//! gateway refuses to start unless the config says `auth = "none"` explicitly.
//!
//! Owns: that rule and its message. Must not: bind sockets or read secrets.

use std::net::SocketAddr;

use crate::config::{AuthMode, Config};

/// `Err(message)` when `cfg` must not serve on `addr` (the plain listener) or on its
/// `server.tls_listen` address (keys as the config alone says).
pub fn check(cfg: &Config, addr: SocketAddr) -> Result<(), String> {
    check_with(cfg, addr, cfg.auth_mode() == AuthMode::Keys)
}

/// As `check`, with whether keys are checked decided by the caller (keys made through the admin
/// API and kept in the state store count).
pub fn check_with(cfg: &Config, addr: SocketAddr, keys: bool) -> Result<(), String> {
    let explicit_none = cfg
        .server
        .auth
        .as_ref()
        .is_some_and(|a| a.get_ref() == "none");
    if keys || explicit_none {
        return Ok(());
    }
    let tls = cfg.tls_listen_addr().ok().flatten();
    match std::iter::once(addr)
        .chain(tls)
        .find(|a| !a.ip().is_loopback())
    {
        None => Ok(()),
        Some(addr) => Err(refusal(addr)),
    }
}

fn refusal(addr: SocketAddr) -> String {
    format!(
        "refusing to listen on {addr} without keys: anyone who can reach it could spend the provider keys. \
         Add [[key]] entries (see docs/keys-and-limits.md), listen on a loopback address, \
         or set auth = \"none\" in [server] to serve without keys on purpose"
    )
}

/// One line for the start-up log: how requests are authenticated.
pub fn summary(cfg: &Config) -> String {
    match cfg.auth_mode() {
        AuthMode::Keys if cfg.limits.shared() => {
            format!("auth keys ({}), {}", cfg.keys.len(), cfg.limits.summary())
        }
        AuthMode::Keys => format!("auth keys ({})", cfg.keys.len()),
        AuthMode::None => "auth none".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_loopback_needs_keys_or_an_explicit_none() {
        let any: SocketAddr = "0.0.0.0:8080".parse().unwrap();
        let lo: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        let lo6: SocketAddr = "[::1]:8080".parse().unwrap();
        let bare = Config::parse("").unwrap();
        assert!(check(&bare, lo).is_ok() && check(&bare, lo6).is_ok());
        let e = check(&bare, any).unwrap_err();
        assert!(
            e.contains("auth = \"none\"") && e.contains("0.0.0.0:8080"),
            "{e}"
        );
        let none = Config::parse("[server]\nauth = \"none\"\n").unwrap();
        assert!(check(&none, any).is_ok());
        let keyed = Config::parse(&format!(
            "[[key]]\nname = \"a\"\nkey_sha256 = \"{}\"\n",
            "0".repeat(64)
        ))
        .unwrap();
        assert!(check(&keyed, any).is_ok());
        // The TLS listener counts too.
        let tls_any = Config::parse(
            "[server]\ntls_listen = \"0.0.0.0:8443\"\ntls_cert = \"c.pem\"\ntls_key = \"k.pem\"\n",
        )
        .unwrap();
        let e = check(&tls_any, lo).unwrap_err();
        assert!(e.contains("0.0.0.0:8443"), "{e}");
        let tls_lo = Config::parse(
            "[server]\ntls_listen = \"127.0.0.1:8443\"\ntls_cert = \"c.pem\"\ntls_key = \"k.pem\"\n",
        )
        .unwrap();
        assert!(check(&tls_lo, lo).is_ok());
        assert_eq!(summary(&keyed), "auth keys (1)");
    }
}
