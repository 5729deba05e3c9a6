//! Doctor: kernel settings against `tuning/sysctl.conf` (compiled in, so the binary checks the
//! values it was tuned for). Every difference is a warning, never a problem: an untuned box
//! serves correctly, with shorter accept queues or fewer ephemeral ports under bursts.
//!
//! Comparison per key: queue lengths and limits want at least the tuned value; timeouts at most;
//! `ip_local_port_range` at least as wide; `tcp_tw_reuse` exactly 1; anything else exactly.
//! Must not: write sysctls (the fix line says how).

use super::Report;

const TUNING: &str = include_str!("../../../tuning/sysctl.conf");

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rule {
    AtLeast,
    AtMost,
    Wider,
    Exact,
}

fn rule(key: &str) -> Rule {
    match key {
        "net.core.somaxconn"
        | "net.ipv4.tcp_max_syn_backlog"
        | "net.core.netdev_max_backlog"
        | "fs.file-max" => Rule::AtLeast,
        "net.ipv4.tcp_fin_timeout" => Rule::AtMost,
        "net.ipv4.ip_local_port_range" => Rule::Wider,
        _ => Rule::Exact,
    }
}

/// `key = value` lines of a sysctl.conf (comments and blanks skipped).
fn entries(text: &str) -> Vec<(&str, String)> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with(';'))
        .filter_map(|l| {
            let (k, v) = l.split_once('=')?;
            Some((k.trim(), normalize(v)))
        })
        .collect()
}

/// Whitespace-separated fields joined by one space (`/proc/sys` uses tabs).
fn normalize(v: &str) -> String {
    v.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn numbers(v: &str) -> Option<Vec<u64>> {
    v.split_whitespace().map(|n| n.parse().ok()).collect()
}

/// Whether `have` satisfies the tuned `want` under `rule`.
fn satisfied(rule: Rule, have: &str, want: &str) -> bool {
    let (Some(h), Some(w)) = (numbers(have), numbers(want)) else {
        return have == want;
    };
    match (rule, h.as_slice(), w.as_slice()) {
        (Rule::AtLeast, [h], [w]) => h >= w,
        (Rule::AtMost, [h], [w]) => h <= w,
        (Rule::Wider, [hl, hh], [wl, wh]) => hl <= wl && hh >= wh,
        _ => h == w,
    }
}

pub fn check(r: &mut Report) {
    r.section("sysctl (against tuning/sysctl.conf)");
    let mut matching = Vec::new();
    let mut differ: Vec<(String, String)> = Vec::new();
    for (key, want) in entries(TUNING) {
        let path = format!("/proc/sys/{}", key.replace('.', "/"));
        let Ok(have) = std::fs::read_to_string(&path) else {
            r.info(format!("{key}: not readable here (tuning: {want})"));
            continue;
        };
        let have = normalize(&have);
        let rule = rule(key);
        if satisfied(rule, &have, &want) {
            matching.push(key);
            continue;
        }
        let wanted = match rule {
            Rule::AtLeast => format!(">= {want}"),
            Rule::AtMost => format!("<= {want}"),
            Rule::Wider => format!("at least {want}"),
            Rule::Exact => want.clone(),
        };
        differ.push((
            format!("{key} = {have} (tuning: {wanted})"),
            format!("{key}=\"{want}\""),
        ));
    }
    if !matching.is_empty() {
        r.ok(format!("{} match: {}", matching.len(), matching.join(", ")));
    }
    let fix = format!(
        "sysctl -w {} (to keep: cp tuning/sysctl.conf /etc/sysctl.d/60-ringgate.conf && sysctl --system)",
        differ.iter().map(|(_, f)| f.as_str()).collect::<Vec<_>>().join(" ")
    );
    let n = differ.len();
    for (i, (text, _)) in differ.into_iter().enumerate() {
        // one fix line for all of them, after the last
        r.add(super::Level::Warn, text, (i + 1 == n).then(|| fix.clone()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tuning_file_parses_and_rules_compare() {
        let e = entries(TUNING);
        assert!(e
            .iter()
            .any(|(k, v)| *k == "net.core.somaxconn" && v == "8192"));
        assert!(e
            .iter()
            .any(|(k, v)| *k == "net.ipv4.tcp_rmem" && v == "4096 87380 4194304"));
        assert!(satisfied(Rule::AtLeast, "16384", "8192"));
        assert!(!satisfied(Rule::AtLeast, "4096", "8192"));
        assert!(satisfied(Rule::AtMost, "10", "15"));
        assert!(!satisfied(Rule::AtMost, "60", "15"));
        assert!(satisfied(Rule::Wider, "1024 65535", "10240 65535"));
        assert!(!satisfied(Rule::Wider, "32768 60999", "10240 65535"));
        assert!(satisfied(
            Rule::Exact,
            "4096 87380 4194304",
            "4096 87380 4194304"
        ));
        assert!(!satisfied(Rule::Exact, "2", "1"));
        assert_eq!(normalize("4096\t131072\t6291456\n"), "4096 131072 6291456");
    }
}
