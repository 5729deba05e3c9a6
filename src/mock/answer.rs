//! What the standalone mock answers to one request, decided from its path and body before
//! anything is written: a generation in one dialect, or a complete JSON body (errors, token
//! counts, embeddings, the model list). Written either normally (paced by the profile, through
//! the dialect writers) or whole and unpaced as `Rendered` bytes, which `inject` breaks.
//!
//! Owns: the answer value and its two renderings. Must not: parse HTTP or choose faults.

use std::io;

use monoio::io::AsyncWriteRent;

use super::speaker_of;
use super::{pace, Dialect, MockRequest, Profile};

/// One request's answer.
#[derive(Debug, Clone)]
pub enum Answer {
    /// A generation in `dialect`; for Gemini streams `sse` picks SSE (`alt=sse`) over a JSON
    /// array.
    Generate {
        dialect: Dialect,
        req: MockRequest,
        sse: bool,
    },
    /// A complete JSON body. `errors`: the dialect of errors injected in its place. `paced`: a
    /// 200 waits for the profile's first-token delay.
    Json {
        status: u16,
        body: Vec<u8>,
        errors: Dialect,
        paced: bool,
    },
}

/// An answer as bytes: what a well-behaved mock would send, without timing.
#[derive(Debug, Clone)]
pub struct Rendered {
    pub status: u16,
    pub content_type: &'static [u8],
    pub body: Vec<u8>,
    /// The body is an SSE stream (events end with a blank line).
    pub sse: bool,
}

impl Answer {
    /// A generation request (`req.stream` says whether it streams).
    pub fn generate(dialect: Dialect, req: MockRequest) -> Answer {
        Answer::Generate {
            dialect,
            req,
            sse: true,
        }
    }

    /// The model the request asked for (generations only).
    pub fn model(&self) -> Option<&str> {
        match self {
            Answer::Generate { req, .. } => Some(&req.model),
            Answer::Json { .. } => None,
        }
    }

    /// The dialect of a generation.
    pub fn dialect(&self) -> Option<Dialect> {
        match self {
            Answer::Generate { dialect, .. } => Some(*dialect),
            Answer::Json { .. } => None,
        }
    }

    /// The dialect errors in place of this answer are written in (the request's).
    pub fn errors(&self) -> Dialect {
        match self {
            Answer::Generate { dialect, .. } => *dialect,
            Answer::Json { errors, .. } => *errors,
        }
    }

    /// Write the answer as the mock normally does (paced by `profile`).
    pub async fn write<S: AsyncWriteRent>(
        &self,
        s: &mut S,
        profile: Profile,
        keep_alive: bool,
    ) -> io::Result<()> {
        match self {
            Answer::Generate { dialect, req, sse } if req.stream && *sse => {
                let mut events = (speaker_of(*dialect).events)(req, true);
                pace::stream(s, &mut *events, profile, keep_alive).await
            }
            // a JSON body, or a Gemini stream as one JSON array
            Answer::Generate { .. } => {
                let r = self.render();
                pace::json(s, r.status, &r.body, profile, keep_alive).await
            }
            Answer::Json {
                status,
                body,
                paced,
                ..
            } => {
                let p = if *paced { profile } else { Profile::Instant };
                pace::json(s, *status, body, p, keep_alive).await
            }
        }
    }

    /// The whole answer as bytes, unpaced.
    pub fn render(&self) -> Rendered {
        let json = |status, body| Rendered {
            status,
            content_type: b"application/json",
            body,
            sse: false,
        };
        let sse_body = |body| Rendered {
            status: 200,
            content_type: b"text/event-stream",
            body,
            sse: true,
        };
        match self {
            Answer::Json { status, body, .. } => json(*status, body.clone()),
            Answer::Generate { dialect, req, sse } => {
                let speaker = speaker_of(*dialect);
                if !req.stream {
                    json(200, (speaker.body)(req))
                } else if *sse {
                    sse_body(pace::transcript(&mut *(speaker.events)(req, true)))
                } else {
                    // a Gemini stream without `alt=sse`: one JSON array
                    json(200, pace::transcript(&mut *(speaker.events)(req, false)))
                }
            }
        }
    }
}
