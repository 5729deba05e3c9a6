//! What the standalone mock answers to one request, decided from its path and body before
//! anything is written: a generation in one dialect, or a complete JSON body (errors, token
//! counts, embeddings, the model list). Written either normally (paced by the profile, through
//! the dialect writers) or whole and unpaced as `Rendered` bytes, which `inject` breaks.
//!
//! Owns: the answer value and its two renderings. Must not: parse HTTP or choose faults.

use std::io;

use monoio::io::AsyncWriteRent;

use super::error;
use super::{anthropic, chat, gemini, pace, responses, Dialect, MockRequest, Profile};
use crate::error::ErrorShape;

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
    /// A complete JSON body. `paced`: a 200 waits for the profile's first-token delay.
    Json {
        status: u16,
        body: Vec<u8>,
        shape: ErrorShape,
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

    /// The error shape of the request's dialect.
    pub fn shape(&self) -> ErrorShape {
        match self {
            Answer::Generate { dialect, .. } => error::shape(*dialect),
            Answer::Json { shape, .. } => *shape,
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
                let (s, p, k) = (s, profile, keep_alive);
                match dialect {
                    Dialect::Chat => pace::stream(s, &mut chat::events(req), p, k).await,
                    Dialect::Responses => pace::stream(s, &mut responses::events(req), p, k).await,
                    Dialect::Messages => pace::stream(s, &mut anthropic::events(req), p, k).await,
                    Dialect::Gemini => pace::stream(s, &mut gemini::events(req, true), p, k).await,
                }
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
        let sse = |body| Rendered {
            status: 200,
            content_type: b"text/event-stream",
            body,
            sse: true,
        };
        match self {
            Answer::Json { status, body, .. } => json(*status, body.clone()),
            Answer::Generate {
                dialect,
                req,
                sse: gemini_sse,
            } => match (dialect, req.stream) {
                (Dialect::Chat, false) => json(200, chat::completion_body(req)),
                (Dialect::Responses, false) => json(200, responses::response_body(req)),
                (Dialect::Messages, false) => json(200, anthropic::message_body(req)),
                (Dialect::Gemini, false) => json(200, gemini::response_body(req)),
                (Dialect::Chat, true) => sse(pace::transcript(&mut chat::events(req))),
                (Dialect::Responses, true) => sse(pace::transcript(&mut responses::events(req))),
                (Dialect::Messages, true) => sse(pace::transcript(&mut anthropic::events(req))),
                (Dialect::Gemini, true) => {
                    let body = pace::transcript(&mut gemini::events(req, *gemini_sse));
                    if *gemini_sse {
                        sse(body)
                    } else {
                        json(200, body)
                    }
                }
            },
        }
    }
}
