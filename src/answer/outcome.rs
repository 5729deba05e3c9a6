//! How a request ended: its status (for metrics) and whether the connection may carry another
//! request; and the two ways an answer ends early (an error response, a client gone).
//!
//! Owns: `Outcome`. Must not: decide what to answer (the stages do) or log.

use crate::dialect::Dialect;
use crate::error::ErrorShape;
use crate::observe::metrics::bump;
use crate::observe::metrics::ShardMetrics;

pub use crate::http::outcome::Outcome;

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
    client.wire().error_shape
}
