//! How a request ended: its status (for metrics) and whether the connection may carry another
//! request; and the two ways an answer ends early (an error response, a client gone).
//!
//! Owns: `Outcome`. Must not: decide what to answer (the stages do) or log.

use std::time::Duration;

use crate::dialect::Dialect;
use crate::error::{Error, ErrorShape};
use crate::http::conn::ClientConn;
use crate::observe::metrics::bump;
use crate::observe::metrics::ShardMetrics;

/// How a request ended, for metrics and the connection loop.
pub struct Outcome {
    pub status: u16,
    pub keep_alive: bool,
}

impl Outcome {
    pub async fn error(
        conn: &mut ClientConn,
        e: &Error,
        shape: ErrorShape,
        keep_alive: bool,
        wt: Duration,
    ) -> Outcome {
        // The request's id is on every response head (`ClientConn::start_request`); an
        // upstream failure's generic message names it too.
        let keep = conn.respond_error(e, shape, keep_alive, wt).await;
        Outcome {
            status: e.status(),
            keep_alive: keep,
        }
    }
}

/// The client went away mid-response: the exchange is dropped by the caller, which closes the
/// upstream connection instead of pooling it.
pub fn gone(metrics: &ShardMetrics, status: u16) -> Outcome {
    bump(&metrics.client_disconnects);
    Outcome {
        status,
        keep_alive: false,
    }
}

/// The error body shape of a client dialect.
pub fn shape(client: Dialect) -> ErrorShape {
    match client {
        Dialect::Messages => ErrorShape::Anthropic,
        Dialect::Gemini => ErrorShape::Gemini,
        Dialect::Chat | Dialect::Responses => ErrorShape::OpenAi,
    }
}
