//! What a new config file changes, decided on the parsed TOML trees (`toml::Value`) of the
//! running file and the new one: the settings a reload applies (`changes`) and those only a
//! restart can (`restart_needed`).
//!
//! Applied live: `[[provider]]`, `[[model]]`, `[routing]` (the route table, its pools and
//! routing state), `[[key]]` (the key registry; runtime keys made through the admin API are
//! kept), `[[mcp_server]]` (the MCP servers behind `/mcp`; open sessions keep the others'), `[reload]` (read from the new file itself, `reload::guard`), `server.tls_cert` / `server.tls_key` (the certificate is re-read on every reload).
//! Everything else — listen addresses, shard count, `[admission]` (the memory budget),
//! `[upstream]`, `[limits]`, `[log]`, `[admin]`, the other `[server]` settings — is set at start
//! and reported by its dotted name when the new file differs from the one the process started
//! with, until a restart or a file that agrees again. Overrides from the command line
//! (`config::origin`) are not differences.
//!
//! Owns: `restart_needed`, `changes`. Must not: read files or apply anything.

use toml::Value;

use crate::config::origin::Origin;

/// Top-level sections a reload applies.
const LIVE: [&str; 7] = [
    "provider",
    "model",
    "routing",
    "key",
    "reload",
    "mcp_server",
    "telemetry",
];
/// `[server]` settings a reload applies.
const LIVE_SERVER: [&str; 2] = ["tls_cert", "tls_key"];

/// Settings that differ between `started` (the file the process started with) and `new` and
/// cannot change without a restart, as dotted names (`server.listen`, `admission`).
pub fn restart_needed(started: &Value, new: &Value, origin: &Origin) -> Vec<String> {
    let mut out = Vec::new();
    let (a, b) = (table(started), table(new));
    let mut sections: Vec<&String> = a.keys().chain(b.keys()).collect();
    sections.sort();
    sections.dedup();
    for s in sections {
        if LIVE.contains(&s.as_str()) {
            continue;
        }
        let (x, y) = (a.get(s), b.get(s));
        if x == y {
            continue;
        }
        match (x, y) {
            (Some(Value::Table(_)) | None, Some(Value::Table(_)) | None) => {
                let (tx, ty) = (
                    x.map(table).unwrap_or_default(),
                    y.map(table).unwrap_or_default(),
                );
                let mut keys: Vec<&String> = tx.keys().chain(ty.keys()).collect();
                keys.sort();
                keys.dedup();
                for k in keys {
                    if tx.get(k) == ty.get(k) || overridden(s, k, origin) {
                        continue;
                    }
                    if s == "server" && LIVE_SERVER.contains(&k.as_str()) {
                        continue;
                    }
                    out.push(format!("{s}.{k}"));
                }
            }
            _ => out.push(s.clone()),
        }
    }
    out
}

/// Whether `section.key` is set by the command line, so the file's value does not count.
fn overridden(section: &str, key: &str, origin: &Origin) -> bool {
    section == "server"
        && match key {
            "listen" => origin.listen.is_some(),
            "shards" => origin.shards.is_some(),
            _ => false,
        }
}

/// What a reload from `old` to `new` applies: `model NAME added|removed|changed`,
/// `provider NAME …`, `routing`, `key NAME …`, `tls certificate` — for the log and the report.
pub fn changes(old: &Value, new: &Value) -> Vec<String> {
    let mut out = Vec::new();
    for (section, what) in [
        ("provider", "provider"),
        ("model", "model"),
        ("key", "key"),
        ("mcp_server", "mcp_server"),
    ] {
        let (a, b) = (named(old, section), named(new, section));
        for (name, v) in &b {
            match a.iter().find(|(n, _)| n == name) {
                None => out.push(format!("{what} {name} added")),
                Some((_, w)) if w != v => out.push(format!("{what} {name} changed")),
                Some(_) => {}
            }
        }
        for (name, _) in &a {
            if !b.iter().any(|(n, _)| n == name) {
                out.push(format!("{what} {name} removed"));
            }
        }
    }
    if old.get("routing") != new.get("routing") {
        out.push("routing".into());
    }
    out
}

/// The entries of an array of tables (`[[model]]`) by their `name`.
fn named<'a>(v: &'a Value, section: &str) -> Vec<(String, &'a Value)> {
    match v.get(section) {
        Some(Value::Array(items)) => items
            .iter()
            .map(|i| {
                let name = i.get("name").and_then(Value::as_str).unwrap_or("");
                (name.to_string(), i)
            })
            .collect(),
        _ => Vec::new(),
    }
}

fn table(v: &Value) -> toml::map::Map<String, Value> {
    match v {
        Value::Table(t) => t.clone(),
        _ => toml::map::Map::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(text: &str) -> Value {
        text.parse::<Value>().unwrap()
    }

    const BASE: &str = r#"
[server]
listen = "127.0.0.1:8080"
shards = 2
tls_cert = "a.pem"
[admission]
budget = "1GiB"
[[provider]]
name = "mock"
kind = "mock"
[[model]]
name = "a"
provider = "mock"
"#;

    #[test]
    fn models_providers_routing_keys_and_certs_are_live() {
        let new = BASE
            .replace("tls_cert = \"a.pem\"", "tls_cert = \"b.pem\"")
            .replace("name = \"a\"", "name = \"b\"")
            + "[routing]\nmax_attempts = 3\n[[key]]\nname = \"k\"\nkey_env = \"K\"\n";
        let none = restart_needed(&v(BASE), &v(&new), &Origin::default());
        assert!(none.is_empty(), "{none:?}");
        let ch = changes(&v(BASE), &v(&new));
        assert_eq!(
            ch,
            ["model b added", "model a removed", "key k added", "routing"],
            "{ch:?}"
        );
    }

    #[test]
    fn listen_shards_budget_and_new_sections_need_a_restart() {
        let new = BASE
            .replace("8080", "9090")
            .replace("shards = 2", "shards = 4")
            .replace("1GiB", "2GiB")
            + "[admin]\nlisten = \"127.0.0.1:8081\"\n[upstream]\nconnect_timeout_ms = 1\n";
        let r = restart_needed(&v(BASE), &v(&new), &Origin::default());
        assert_eq!(
            r,
            [
                "admin.listen",
                "admission.budget",
                "server.listen",
                "server.shards",
                "upstream.connect_timeout_ms"
            ]
        );
        // a removed setting counts too
        let gone = BASE.replace("shards = 2\n", "");
        assert_eq!(
            restart_needed(&v(BASE), &v(&gone), &Origin::default()),
            ["server.shards"]
        );
    }

    #[test]
    fn command_line_overrides_are_not_changes() {
        let new = BASE
            .replace("8080", "9090")
            .replace("shards = 2", "shards = 4");
        let origin = Origin {
            listen: Some("127.0.0.1:0".into()),
            shards: Some(1),
            ..Origin::default()
        };
        assert!(restart_needed(&v(BASE), &v(&new), &origin).is_empty());
    }

    #[test]
    fn a_changed_deployment_is_a_changed_model() {
        let new = BASE.replace(
            "provider = \"mock\"\n",
            "provider = \"mock\"\nupstream_model = \"x\"\n",
        );
        assert_eq!(changes(&v(BASE), &v(&new)), ["model a changed"]);
        assert!(changes(&v(BASE), &v(BASE)).is_empty());
    }
}
