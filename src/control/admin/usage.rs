//! The usage endpoints of the admin API: `GET /admin/usage` (every key × model × period row of
//! the spend ledger) and `GET /admin/keys/{name}/usage` (one key's rows, its budget and what it
//! spent in its current period). Numbers are read from the process-wide `SpendBook` (all
//! shards, restored rows included) at the moment of the request.
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

/// `GET /admin/usage`.
pub(super) fn all(ctx: &Ctx) -> Reply {
    let rows: Vec<Value> = ctx.spend.snapshot().iter().map(row).collect();
    Reply::json(200, &json!({ "usage": rows }))
}

/// `GET /admin/keys/{name}/usage` (`live`: a live key has that name).
pub(super) fn of_key(ctx: &Ctx, name: &str, live: bool) -> Result<Reply, Error> {
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
    Ok(Reply::json(
        200,
        &json!({
            "key": name,
            "budget_period": period,
            "budget_usd": budget,
            "spent_usd": spent,
            "usage": rows,
        }),
    ))
}
