//! HTTP/1.1 wire handling, split like hyper's `proto/h1`: `head` parses request heads,
//! `chunked` decodes chunked bodies, `response` writes response heads and chunk frames, `io`
//! moves bytes between owned buffers and monoio streams, `edge` holds the browser-facing
//! `Origin`/`Host` checks, `expect` answers `Expect: 100-continue`, `request` is one request (its head's bytes kept until it ends),
//! `stream` is the plain-or-TLS client socket under a connection, `multipart` finds one small
//! field in the first parts of a `multipart/form-data` body (bounded).
//!
//! Owns: framing rules (RFC 9112) and limits. Must not: know about models, providers or JSON.

pub mod target;

pub mod body;
pub mod certs;
pub mod chunked;
pub mod conn;
pub mod edge;
pub mod expect;
pub mod head;
pub mod io;
pub mod multipart;
pub mod outcome;
pub mod request;
pub mod request_id;
pub mod response;
pub mod stream;

pub use head::{BodyFraming, Method, RequestHead};
pub use request::Request;
