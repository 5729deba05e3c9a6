//! Respond: (client, open upstream exchange, passthrough | translate) → bytes to the client.
//! The second half of the seam after `forward`: whatever deployment answered, after however
//! many attempts, its answer is written here — relayed as is, or translated back.
//!
//! Owns: the one dispatch on `plan::Mode` for answers. Must not: send upstream requests or
//! retry (once a byte went to the client there is no retry: a broken stream ends with the
//! client dialect's error event, see `relay` and `bridge`).

use crate::answer::outcome::Outcome;
use crate::forward::open::{Call, Opened};
use crate::forward::plan::Mode;
use crate::forward::Env;
use crate::http::conn::ClientConn;
use crate::{answer::bridge, answer::relay};

/// Write the answer of `opened` to the client in `call`'s dialect. A keyed request's grant
/// (`call.grant`) learns the answer's status and who answered, and gets the answer's usage
/// (scanned from relayed bytes, or handed over by the translator).
pub async fn respond(
    conn: &mut ClientConn,
    env: &Env<'_>,
    call: &mut Call<'_>,
    opened: &mut Opened<'_>,
) -> Outcome {
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
    match opened.mode {
        Mode::Passthrough { .. } => relay::passthrough(conn, env, call, opened).await,
        // Boxed: a translation's state is large, and inline it would make every request's
        // future (moved into its box once per request) that much larger, passthrough too.
        Mode::Translate { .. } => Box::pin(bridge::translated(conn, env, call, opened)).await,
    }
}
