//! The admin token rule: which tokens may guard an admin listener on which address (what
//! `serve` refuses to start with and a reload refuses to apply).
//!
//! Owns: `weak_token`, `MIN_TOKEN_BYTES`. Must not: read the env (callers pass the bytes).

use std::net::SocketAddr;

/// Shortest admin token accepted on a non-loopback admin listener.
pub const MIN_TOKEN_BYTES: usize = 16;

/// Why the admin token (`raw`, from `env`) may not guard a listener on `addr`: none at all,
/// shorter than `MIN_TOKEN_BYTES` or only whitespace on a non-loopback address. What `serve`
/// refuses to start with and a reload refuses to apply (`Config::validate`).
pub fn weak_token(addr: SocketAddr, env: &str, raw: Option<&[u8]>) -> Option<String> {
    if addr.ip().is_loopback() {
        return None;
    }
    let Some(raw) = raw else {
        return Some(format!(
            "refusing to serve the admin API on {addr} without a token: anyone who can reach it could make keys and read usage. \
             Set the env var {env} (admin.token_env) to a long random secret, or listen on a loopback address"
        ));
    };
    let blank = raw.iter().all(u8::is_ascii_whitespace);
    if raw.len() < MIN_TOKEN_BYTES || blank {
        let what = match blank {
            true => "only whitespace".to_string(),
            false => format!("{} bytes long", raw.len()),
        };
        return Some(format!(
            "refusing to serve the admin API on {addr} with a weak token: {env} is {what}; a non-loopback admin listener needs at least {MIN_TOKEN_BYTES} bytes that are not all whitespace \
             (e.g. `openssl rand -hex 32`), or listen on a loopback address"
        ));
    }
    None
}
