//! Entry points for the fuzz targets in `fuzz/` (cargo-fuzz), and nothing else.
//!
//! Owns: thin, pure wrappers that make crate-private parsers reachable from outside the crate
//! without widening their visibility in the modules that own them. Must not: contain parsing
//! logic of its own, do IO, or be used by the gateway (it is `#[doc(hidden)]` and unstable).

use crate::error::Error;
use crate::upstream::ResponseHead;

/// The upstream response-head parser (`upstream::exchange`): `Ok(None)` means "need more
/// bytes"; `Ok(Some((head, len)))` gives the head and the bytes it took (interim 1xx responses
/// included).
pub fn parse_response_head(buf: &[u8]) -> Result<Option<(ResponseHead, usize)>, Error> {
    crate::upstream::exchange::parse_response_head(buf)
}
