//! How a request ended: its status (for metrics) and whether the connection may carry another
//! request. Lives with the connection so every stage that answers (the answer stage, MCP)
//! names it without importing the answer stage; the writes that end in one are
//! `answer::Sink`'s (whole answers, early errors) and `answer::stream::run`'s.
//!
//! Owns: `Outcome`. Must not: decide what to answer (the stages do), write, count or log.

/// How a request ended, for metrics and the connection loop.
pub struct Outcome {
    pub status: u16,
    pub keep_alive: bool,
}
