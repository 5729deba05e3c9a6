//! Fleet usage (`GET /admin/usage?scope=fleet`): every node publishes its own spend ledger rows
//! (key × model × period: requests, tokens, nano-USD) to the store, and any node reads every
//! node's rows back.
//!
//! In the store: `<prefix>{fleet}:usage:nodes` (a set of node names, `[fleet] node`) and per
//! node `<prefix>{fleet}:usage:<node>` (a hash: `<key>\t<model>\t<period start>` →
//! `<requests> <input tokens> <output tokens> <nano-USD>`). The fleet thread writes its rows
//! when they changed, at most once per `EVERY`; a node restarted under the same name restores
//! its ledger and writes the same rows again (never counted twice). The `{fleet}` hash tag keeps
//! every key in one slot on a Cluster.
//!
//! Rows read back are hostile bytes: node names follow the key name rule, fields have three
//! parts, numbers are plain u64, at most `MAX_ROWS` per node and `MAX_NODES` nodes; anything
//! else is skipped and counted.
//!
//! Owns: the row wire form, `NodeUsage`. Must not: know about the admin API's JSON or do IO
//! itself (the fleet thread calls `publish` and `read` with its store).

use std::time::{Duration, Instant};

use super::super::store::resp::{Arg, Reply};
use super::super::store::Store;
use crate::governance::spend::UsageRow;

/// How often a node's rows are written (when they changed).
pub const EVERY: Duration = Duration::from_secs(1);
/// Most rows read per node.
pub const MAX_ROWS: usize = 100_000;
/// Most nodes read.
pub const MAX_NODES: usize = 1024;
/// Fields per `HSET` / asked per `HSCAN` page.
const PAGE: usize = 200;
const COMMAND: Duration = Duration::from_secs(2);

/// One node's published rows.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeUsage {
    pub node: String,
    pub rows: Vec<UsageRow>,
}

fn field(r: &UsageRow) -> String {
    format!("{}\t{}\t{}", r.key, r.model, r.period_start)
}

fn value(r: &UsageRow) -> String {
    format!(
        "{} {} {} {}",
        r.requests, r.input_tokens, r.output_tokens, r.spend_nanos
    )
}

/// Parse one hash field and value (`None`: malformed).
pub fn parse(f: &[u8], v: &[u8]) -> Option<UsageRow> {
    let f = std::str::from_utf8(f).ok()?;
    let v = std::str::from_utf8(v).ok()?;
    let mut parts = f.split('\t');
    let (key, model, start) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some()
        || !crate::config::keys::key_name_ok(key)
        || model.is_empty()
        || model.len() > 256
        || model.bytes().any(|b| b.is_ascii_control())
    {
        return None;
    }
    let period_start: i64 = start.parse().ok().filter(|s| *s >= 0)?;
    let mut n = v.split(' ').map(|x| x.parse::<u64>().ok());
    let (requests, input_tokens, output_tokens, spend_nanos) =
        (n.next()??, n.next()??, n.next()??, n.next()??);
    if n.next().is_some() {
        return None;
    }
    Some(UsageRow {
        key: key.to_string(),
        model: model.to_string(),
        requests,
        input_tokens,
        output_tokens,
        spend_usd: spend_nanos as f64 / crate::governance::spend::NANOS_PER_USD as f64,
        spend_nanos,
        period_start,
    })
}

/// The store keys: the node set and node `node`'s hash.
pub fn keys(prefix: &str, node: &str) -> (String, String) {
    (
        format!("{prefix}{{fleet}}:usage:nodes"),
        format!("{prefix}{{fleet}}:usage:{node}"),
    )
}

fn deadline() -> Instant {
    Instant::now() + COMMAND
}

/// Write `rows` of `node` (`false`: a store error).
pub async fn publish(store: &Store, prefix: &str, node: &str, rows: &[UsageRow]) -> bool {
    let (set, hash) = keys(prefix, node);
    let r = store
        .call_at(
            set.as_bytes(),
            &[Arg::S("SADD"), Arg::S(&set), Arg::S(node)],
            deadline(),
        )
        .await;
    if !matches!(r, Ok(Reply::Int(_))) {
        return false;
    }
    for chunk in rows.chunks(PAGE) {
        let pairs: Vec<(String, String)> = chunk.iter().map(|r| (field(r), value(r))).collect();
        let mut args = vec![Arg::S("HSET"), Arg::S(&hash)];
        for (f, v) in &pairs {
            args.push(Arg::S(f));
            args.push(Arg::S(v));
        }
        let r = store.call_at(hash.as_bytes(), &args, deadline()).await;
        if !matches!(r, Ok(Reply::Int(_))) {
            return false;
        }
    }
    true
}

/// Every node's rows (`Err`: a store error); `bad` counts rows and names refused.
pub async fn read(store: &Store, prefix: &str, bad: &mut u64) -> Result<Vec<NodeUsage>, String> {
    let (set, _) = keys(prefix, "");
    let names = match store
        .call_at(
            set.as_bytes(),
            &[Arg::S("SMEMBERS"), Arg::S(&set)],
            deadline(),
        )
        .await
    {
        Ok(Reply::Array(Some(items))) => items,
        other => return Err(format!("SMEMBERS: {other:?}")),
    };
    let mut out = Vec::new();
    for n in names.iter().take(MAX_NODES) {
        let Reply::Bulk(Some(n)) = n else {
            *bad += 1;
            continue;
        };
        let Some(node) = std::str::from_utf8(n)
            .ok()
            .filter(|n| crate::config::keys::key_name_ok(n))
        else {
            *bad += 1;
            continue;
        };
        let (_, hash) = keys(prefix, node);
        let mut rows = Vec::new();
        let mut cursor = "0".to_string();
        for _ in 0..MAX_ROWS / PAGE + 1 {
            let page = store
                .call_at(
                    hash.as_bytes(),
                    &[
                        Arg::S("HSCAN"),
                        Arg::S(&hash),
                        Arg::S(&cursor),
                        Arg::S("COUNT"),
                        Arg::U(PAGE as u64),
                    ],
                    deadline(),
                )
                .await;
            let parts = match page {
                Ok(Reply::Array(Some(parts))) => parts,
                other => return Err(format!("HSCAN: {other:?}")),
            };
            let [Reply::Bulk(Some(next)), Reply::Array(Some(items))] = parts.as_slice() else {
                return Err("HSCAN: a reply of the wrong shape".into());
            };
            for pair in items.chunks(2) {
                match pair {
                    [Reply::Bulk(Some(f)), Reply::Bulk(Some(v))] if rows.len() < MAX_ROWS => {
                        match parse(f, v) {
                            Some(r) => rows.push(r),
                            None => *bad += 1,
                        }
                    }
                    _ => *bad += 1,
                }
            }
            cursor = String::from_utf8_lossy(next).into_owned();
            if cursor == "0" {
                break;
            }
        }
        out.push(NodeUsage {
            node: node.to_string(),
            rows,
        });
    }
    out.sort_by(|a, b| a.node.cmp(&b.node));
    Ok(out)
}

/// The rows of `nodes` summed per key, model and period.
pub fn sum(nodes: &[NodeUsage]) -> Vec<UsageRow> {
    let mut m: std::collections::BTreeMap<(String, String, i64), UsageRow> = Default::default();
    for n in nodes {
        for r in &n.rows {
            let e = m
                .entry((r.key.clone(), r.model.clone(), r.period_start))
                .or_insert_with(|| UsageRow {
                    requests: 0,
                    input_tokens: 0,
                    output_tokens: 0,
                    spend_nanos: 0,
                    spend_usd: 0.0,
                    ..r.clone()
                });
            e.requests = e.requests.saturating_add(r.requests);
            e.input_tokens = e.input_tokens.saturating_add(r.input_tokens);
            e.output_tokens = e.output_tokens.saturating_add(r.output_tokens);
            e.spend_nanos = e.spend_nanos.saturating_add(r.spend_nanos);
            e.spend_usd = e.spend_nanos as f64 / crate::governance::spend::NANOS_PER_USD as f64;
        }
    }
    m.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(key: &str, req: u64) -> UsageRow {
        UsageRow {
            key: key.into(),
            model: "gpt-*".into(),
            requests: req,
            input_tokens: 10 * req,
            output_tokens: req,
            spend_usd: req as f64 / 1e9,
            spend_nanos: req,
            period_start: 86_400,
        }
    }

    #[test]
    fn rows_round_trip_hostile_ones_are_refused_and_nodes_sum() {
        let r = row("team-a", 3);
        assert_eq!(parse(field(&r).as_bytes(), value(&r).as_bytes()), Some(r));
        for (f, v) in [
            ("bad name\tm\t0", "1 1 1 1"),
            ("team-a\tm", "1 1 1 1"),
            ("team-a\tm\t-1", "1 1 1 1"),
            ("team-a\tm\t0\tx", "1 1 1 1"),
            ("team-a\t\t0", "1 1 1 1"),
            ("team-a\tm\t0", "1 1 1"),
            ("team-a\tm\t0", "1 1 1 -1"),
            ("team-a\tm\t0", "1 1 1 1 1"),
            ("team-a\tm\t0", "1 1 1 99999999999999999999999"),
        ] {
            assert_eq!(parse(f.as_bytes(), v.as_bytes()), None, "{f:?} {v:?}");
        }
        let nodes = [
            NodeUsage {
                node: "a".into(),
                rows: vec![row("team-a", 2), row("team-b", 1)],
            },
            NodeUsage {
                node: "b".into(),
                rows: vec![row("team-a", 5)],
            },
        ];
        let s = sum(&nodes);
        assert_eq!(s.len(), 2);
        assert_eq!((s[0].key.as_str(), s[0].requests), ("team-a", 7));
        assert_eq!(s[0].input_tokens, 70);
        assert_eq!(s[0].spend_nanos, 7);
    }
}
