//! `ops/grafana/ringgate.json` and `ops/prometheus.yml` against the real gateway: every metric
//! a dashboard expression names is a family a scrape of the gateway exports (`# TYPE` lines of
//! a real scrape, with keys on so the key families are there); every panel has queries on the
//! dashboard's data source; the expressions parse (`promtool check rules`) and the scrape
//! example is a valid config (`promtool check config`) — the promtool checks skip with a
//! message when it is not installed (CI installs it).

#[path = "../common/mod.rs"]
mod common;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;

use common::*;
use ringgate::governance::keyring::Digest;
use ringgate::mock::Profile;

const SECRET: &str = "rg-test-dashboard-0a1b2c3d4e5f60718293a4b5";

fn repo(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// Every PromQL string of the dashboard: panel target `expr`s and template variable queries.
fn expressions(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, x) in m {
                match (k.as_str(), x) {
                    ("expr" | "definition", serde_json::Value::String(s)) => out.push(s.clone()),
                    ("query", serde_json::Value::String(s)) if s.contains("ringgate_") => {
                        out.push(s.clone())
                    }
                    _ => expressions(x, out),
                }
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|x| expressions(x, out)),
        _ => {}
    }
}

/// `ringgate_*` identifiers in `expr`.
fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let b = expr.as_bytes();
    let mut i = 0;
    while let Some(at) = expr[i..].find("ringgate_") {
        let start = i + at;
        let mut end = start;
        while end < b.len() && (b[end].is_ascii_alphanumeric() || b[end] == b'_') {
            end += 1;
        }
        names.push(expr[start..end].to_string());
        i = end;
    }
    names
}

/// Family name → type, from a scrape's `# TYPE` lines.
fn exported(scrape: &str) -> std::collections::BTreeMap<String, String> {
    scrape
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .map(|(n, t)| (n.to_string(), t.to_string()))
        .collect()
}

fn promtool(args: &[&str]) -> Option<std::process::Output> {
    match Command::new("promtool").args(args).output() {
        Ok(o) => Some(o),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            assert!(
                std::env::var_os("RINGGATE_REQUIRE_PROMTOOL").is_none(),
                "promtool is not installed but RINGGATE_REQUIRE_PROMTOOL is set (.ci/run)"
            );
            eprintln!(
                "SKIPPED promtool {args:?}: promtool is not installed (apt-get install prometheus)"
            );
            None
        }
        Err(e) => panic!("promtool: {e}"),
    }
}

#[test]
fn dashboard_names_only_exported_families_and_its_queries_parse() {
    one_driver("epoll").for_each(dashboard_names_only_exported_families_and_its_queries_parse_at);
}

fn dashboard_names_only_exported_families_and_its_queries_parse_at(v: Variant) {
    let text = std::fs::read_to_string(repo("ops/grafana/ringgate.json")).unwrap();
    let dash: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(dash["uid"], "ringgate");
    let panels = dash["panels"].as_array().unwrap();
    let mut queried = 0;
    for p in panels.iter().filter(|p| p["type"] != "row") {
        let title = p["title"].as_str().unwrap();
        let targets = p["targets"]
            .as_array()
            .unwrap_or_else(|| panic!("{title}: no targets"));
        assert!(!targets.is_empty(), "{title}: no targets");
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{title}");
        for t in targets {
            assert!(
                t["expr"].as_str().is_some_and(|e| e.contains("ringgate_")),
                "{title}: {t}"
            );
            queried += 1;
        }
    }
    assert!(queried >= 30, "{queried} queries");
    let mut exprs = Vec::new();
    expressions(&dash, &mut exprs);

    // a real scrape, keys on (the key families are rendered only then)
    let hex: String = Digest::of(SECRET.as_bytes())
        .0
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let stack = Stack::new(
        Profile::Instant,
        v,
        &format!("\n[[key]]\nname = \"dash\"\nkey_sha256 = \"{hex}\"\n"),
    );
    let body =
        r#"{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    let raw = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {SECRET}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    assert_eq!(request(stack.addr, raw.as_bytes()).status, 200);
    let scrape = request(stack.addr, &get("/metrics")).text();
    let families = exported(&scrape);

    let mut used = BTreeSet::new();
    for e in &exprs {
        for name in metric_names(e) {
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| {
                    let base = name.strip_suffix(s)?;
                    (families.get(base).map(String::as_str) == Some("histogram")).then_some(base)
                })
                .unwrap_or(&name)
                .to_string();
            assert!(
                families.contains_key(&family),
                "the dashboard names {name} (family {family}), which the gateway does not export: {e}"
            );
            if name.ends_with("_bucket") {
                assert_eq!(families[&family], "histogram", "{e}");
            }
            used.insert(family);
        }
    }
    // the dashboard covers the request families
    for f in [
        "ringgate_requests_total",
        "ringgate_request_duration_seconds",
        "ringgate_gateway_overhead_seconds",
        "ringgate_time_to_first_token_seconds",
        "ringgate_upstream_duration_seconds",
        "ringgate_tokens_total",
        "ringgate_requests_in_flight",
        "ringgate_connections_open",
        "ringgate_admission_rejections_total",
        "ringgate_config_info",
        "ringgate_config_reloads_total",
        "ringgate_access_log_dropped_total",
    ] {
        assert!(used.contains(f), "the dashboard does not show {f}");
    }

    // every expression parses: as recording rules, with Grafana's variables filled in
    let dir = std::env::temp_dir().join(format!("rg-dashboard-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let rules = dir.join("rules.yml");
    let mut y = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, e) in exprs.iter().enumerate() {
        if e.starts_with("label_values(") {
            continue;
        }
        let e = e
            .replace("$__rate_interval", "1m")
            .replace("$__range", "1h")
            .replace("$instance", ".*")
            .replace("$model", ".*");
        y.push_str(&format!(
            "      - record: dashboard:q{i}\n        expr: {}\n",
            serde_json::to_string(&e).unwrap()
        ));
    }
    std::fs::write(&rules, y).unwrap();
    if let Some(o) = promtool(&["check", "rules", rules.to_str().unwrap()]) {
        assert!(
            o.status.success(),
            "promtool check rules: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let cfg = repo("ops/prometheus.yml");
    if let Some(o) = promtool(&["check", "config", cfg.to_str().unwrap()]) {
        assert!(
            o.status.success(),
            "promtool check config: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
