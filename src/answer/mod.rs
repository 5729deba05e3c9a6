//! The answer stage: every byte to the client once a request has been forwarded, and the one
//! sink of every answer that is not a stream. `write` dispatches an opened answer: an error
//! answer (`relay::error_answer`), the same-dialect relay (`relay`, vetted by `vet` and
//! `json_check`), or the translated way back (`bridge`). Two writers put bytes on the
//! connection: the sink (`sink::Sink`: whole answers, a body's pieces as they arrive, and the
//! error response of every failure before a byte went out — returned here as `Err`, answered by
//! the pipeline's `handle` through the same sink) and the one stream loop (`stream`: passthrough
//! vetting and translation are its per-event strategies; read buffer, drain-raced read,
//! guardrails, the stream's last write, in-band error events once bytes went out). How a
//! request ended is `outcome`. Upstream failures are reported through `forward::report`.
//!
//! Owns: the upstream → client byte path, and the client writes of the gateway's own answers
//! (cache hits, local endpoints, preflights, early errors, the OpenAI surface's pieces and the
//! MCP endpoint's replies go through `Sink`; the interim `100 Continue` is written by
//! `http::expect`). Must not: choose
//! deployments or open upstream connections (that is `forward` and `upstream`), or see the
//! shard (it gets a `forward::Env`).

pub mod bridge;
pub use crate::util::json_check;
pub mod outcome;
pub mod relay;
pub mod sink;
pub mod stream;
pub mod vet;

pub use sink::{Sink, Whole};

use crate::error::Error;
use crate::forward::open::{Call, Opened};
use crate::forward::plan::Mode;
use crate::forward::Env;
use crate::http::conn::ClientConn;
use outcome::Outcome;

/// Write the answer of `opened` to the client in `call`'s dialect: relayed as is, or translated
/// back, whatever deployment answered after however many attempts (once a byte went to the
/// client there is no retry: a broken stream ends with the client dialect's error event). A
/// keyed request's grant (`call.grant`) learns the answer's status and who answered, and gets
/// the answer's usage (scanned from relayed bytes, or handed over by the translator). `Err`:
/// nothing went out yet — the caller answers it (`Sink::error`).
pub async fn write(
    conn: &mut ClientConn,
    env: &Env<'_>,
    call: &mut Call<'_>,
    opened: &mut Opened<'_>,
) -> Result<Outcome, Error> {
    let client = call.dialect;
    let by = opened.answered_by();
    let answer_dialect = match opened.mode {
        Mode::Passthrough { .. } => client,
        Mode::Translate { up, .. } => up,
    };
    if answer_dialect != client {
        // the provider's response header lines, in the client dialect's names (header policy)
        crate::upstream::headers::to_client(&mut opened.ex.head.forward, answer_dialect, client);
    }
    if let Some(g) = call.grant.as_mut() {
        g.on_answer(&mut opened.ex.head, by, answer_dialect);
    }
    if opened.ex.head.status >= 400 {
        return relay::error_answer(conn, env, call, opened).await;
    }
    match opened.mode {
        Mode::Passthrough { strip_usage } => {
            relay::passthrough(conn, env, relay::Upstream::of(call, opened, strip_usage)).await
        }
        // Boxed: a translation's state is large, and inline it would make every request's
        // future (moved into its box once per request) that much larger, passthrough too.
        Mode::Translate { .. } => Box::pin(bridge::translated(conn, env, call, opened)).await,
    }
}
