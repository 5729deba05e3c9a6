//! `Expect: 100-continue`, client side: the interim `100 Continue` a client that asked for it
//! gets once its request was admitted, before its body is read (RFC 9110 §10.1.1).
//!
//! Owns: when that interim answer is due and its bytes — the one copy every endpoint that reads a
//! body uses. Must not: decide admission (the caller admits the declared body first), count a
//! gone client (the caller knows what that means to it), or parse upstream interim answers (those
//! are `upstream::exchange`'s).
//!
//! Not written through `answer::Sink`: a `1xx` is not the request's answer (RFC 9110 §15.2 — the
//! answer, with its status, body and `Outcome`, still follows and goes through the sink).

use std::time::Duration;

use crate::http::conn::ClientConn;
use crate::http::{BodyFraming, RequestHead};

/// The interim answer's bytes.
const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

/// Writes `100 Continue` when `head` asked for it and a body follows. `false` when the client is
/// gone (the write failed or timed out); `true` otherwise, also when nothing was due.
pub async fn send_continue(conn: &mut ClientConn, head: &RequestHead, timeout: Duration) -> bool {
    if !head.expect_continue || head.body == BodyFraming::None {
        return true;
    }
    conn.write_raw(CONTINUE.to_vec(), timeout).await.is_some()
}
