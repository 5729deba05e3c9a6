//! How a request ended: its status (for metrics) and whether the connection may carry another
//! request, and the error response that ends one early. Lives with the connection so every
//! stage that answers (the answer stage, MCP) names it without importing the answer stage.
//!
//! Owns: `Outcome`. Must not: decide what to answer (the stages do), count or log.

use std::time::Duration;

use crate::error::{Error, ErrorShape};
use crate::http::conn::ClientConn;

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
