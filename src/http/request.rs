//! One request as the stages read it (`Request`): its head and, once read, its body. The head's
//! bytes stay at the start of the connection's read buffer until the request ends (the body is
//! read after them, `ClientConn::read_body`; the connection drops them when the request
//! is answered), so any stage reads a header when it needs it: `head.header(&conn.buf, ..)`.
//!
//! Owns: `Request`. Must not: interpret headers or the body (the stages do).

use super::head::RequestHead;

/// One request: its parsed head (ranges into the connection's read buffer) and its body (empty
/// until read, and for requests without one).
pub struct Request<'h> {
    pub head: &'h RequestHead,
    pub body: Vec<u8>,
}

impl<'h> Request<'h> {
    /// A request whose body is not read yet.
    pub fn new(head: &'h RequestHead) -> Self {
        Request {
            head,
            body: Vec::new(),
        }
    }
}
