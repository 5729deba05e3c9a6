//! The usage endpoints of the admin API: `GET /admin/usage` (every key × model × period row of
//! the spend ledger) and `GET /admin/keys/{name}/usage` (one key's rows, its budget and what it
//! spent in its current period). Numbers are read from the process-wide `SpendBook` (all
//! shards, restored rows included) at the moment of the request.
//!
//!
//! `?scope=fleet` adds a `fleet` object next to the node's own rows: every node's rows as the
//! shared store holds them (`governance::fleet::usage`: each node publishes its ledger, at
//! most a second old; the asking node's own part is written just before it is read) and their
//! sum per key, model and period. Without a shared store: 400; the store down or slow: 503.
//!
//! Owns: the JSON shape of usage answers. Must not: write to the ledger.

use serde_json::{json, Value};

use super::{Ctx, Reply};
use crate::error::{Error, Kind};
use crate::governance::spend::{unix_now, UsageRow, NANOS_PER_USD};

fn row(r: &UsageRow) -> Value {
    json!({
        "key": r.key,
        "model": r.model,
        "period_start": crate::util::date::rfc3339(r.period_start),
        "requests": r.requests,
        "input_tokens": r.input_tokens,
        "output_tokens": r.output_tokens,
        "spend_usd": r.spend_usd,
    })
}

/// Whether the query asks for `scope=fleet` (the only parameter these endpoints take).
fn fleet_scope(query: Option<&str>) -> Result<bool, Error> {
    let mut fleet = false;
    for pair in query
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
    {
        match pair.split_once('=') {
            Some(("scope", "fleet")) => fleet = true,
            Some(("scope", "node")) => fleet = false,
            _ => {
                return Err(Error::new(
                    Kind::InvalidBody,
                    "unknown query parameter (the usage endpoints take scope=fleet or scope=node)",
                ))
            }
        }
    }
    Ok(fleet)
}

/// Every node's rows (those of `key` only, when given) and their sums, as JSON.
fn fleet(ctx: &Ctx, key: Option<&str>) -> Result<(Value, Vec<UsageRow>), Error> {
    let Some(f) = &ctx.fleet else {
        return Err(Error::new(
            Kind::InvalidBody,
            "scope=fleet needs the shared store ([limits] store = \"redis\")",
        ));
    };
    let mut nodes = f.usage().ok_or_else(|| {
        Error::new(
            Kind::LimitStoreDown,
            "scope=fleet: the shared store is down or did not answer in time",
        )
    })?;
    if let Some(k) = key {
        for n in &mut nodes {
            n.rows.retain(|r| r.key == k);
        }
        nodes.retain(|n| !n.rows.is_empty());
    }
    let total = crate::governance::fleet::usage::sum(&nodes);
    let per_node: Vec<Value> = nodes
        .iter()
        .map(|n| json!({"node": n.node, "usage": n.rows.iter().map(row).collect::<Vec<_>>()}))
        .collect();
    let v = json!({
        "node": f.node(),
        "nodes": per_node,
        "usage": total.iter().map(row).collect::<Vec<_>>(),
    });
    Ok((v, total))
}

/// `GET /admin/usage[?scope=fleet]`.
pub(super) fn all(ctx: &Ctx, query: Option<&str>) -> Result<Reply, Error> {
    let scope = fleet_scope(query)?;
    let rows: Vec<Value> = ctx.spend.snapshot().iter().map(row).collect();
    let mut v = json!({ "usage": rows });
    if scope {
        v["scope"] = json!("fleet");
        v["fleet"] = fleet(ctx, None)?.0;
    }
    Ok(Reply::json(200, &v))
}

/// `GET /admin/keys/{name}/usage[?scope=fleet]` (`live`: a live key has that name).
pub(super) fn of_key(
    ctx: &Ctx,
    name: &str,
    live: bool,
    query: Option<&str>,
) -> Result<Reply, Error> {
    let scope = fleet_scope(query)?;
    let ledger = ctx.spend.get(name);
    if ledger.is_none() && !live {
        return Err(Error::new(Kind::NotFound, format!("no key named {name:?}")));
    }
    let rows: Vec<Value> = ctx
        .spend
        .snapshot()
        .iter()
        .filter(|r| r.key == name)
        .map(row)
        .collect();
    let usd = |n: u64| n as f64 / NANOS_PER_USD as f64;
    let now = unix_now();
    let (period, budget, spent) = match &ledger {
        Some(l) => (
            l.period().as_str(),
            l.budget().map(|b| usd(b.nanos)),
            usd(l.spent(now)),
        ),
        None => ("total", None, 0.0),
    };
    let mut v = json!({
        "key": name,
        "budget_period": period,
        "budget_usd": budget,
        "spent_usd": spent,
        "usage": rows,
    });
    if scope {
        let (mut f, total) = fleet(ctx, Some(name))?;
        // the fleet's spend in the key's current period (as this node counts periods)
        let start = ledger.as_ref().map_or(0, |l| l.period().start(now));
        let nanos = total
            .iter()
            .filter(|r| r.period_start == start)
            .fold(0u64, |a, r| a.saturating_add(r.spend_nanos));
        f["spent_usd"] = json!(usd(nanos));
        v["scope"] = json!("fleet");
        v["fleet"] = f;
    }
    Ok(Reply::json(200, &v))
}
