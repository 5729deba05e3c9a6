//! A ConverseStream answer body → hub Chat `SseEvent`s: the event-stream framing decoded
//! (`eventstream`, CRCs and bounds) and each message translated (`dialect::converse::stream`).
//! The translated stream's relay (`answer::bridge`) reads it as it reads an SSE decoder.
//!
//! Owns: `ConverseEvents`. Must not: do IO.

use std::collections::VecDeque;

use super::eventstream::Decoder;
use crate::dialect::converse::stream::ConverseChunks;
use crate::dialect::SseEvent;

pub struct ConverseEvents {
    frames: Decoder,
    chunks: ConverseChunks,
    ready: VecDeque<SseEvent>,
    scratch: Vec<SseEvent>,
    broken: Option<String>,
}

impl ConverseEvents {
    /// `id`, `created`, `model`: what the Chat chunks carry; `usage_chunk`: a Chat client
    /// asked for the usage chunk.
    pub fn new(id: &str, created: u64, model: &str, usage_chunk: bool) -> ConverseEvents {
        ConverseEvents {
            frames: Decoder::new(),
            chunks: ConverseChunks::new(id, created, model, usage_chunk),
            ready: VecDeque::new(),
            scratch: Vec::new(),
            broken: None,
        }
    }

    pub fn feed(&mut self, bytes: &[u8]) {
        if self.broken.is_some() {
            return;
        }
        self.frames.feed(bytes);
        loop {
            match self.frames.next_frame() {
                Ok(Some(f)) => {
                    let exception = f.message_type != "event";
                    let payload = match (&f.error_message, f.message_type.as_str()) {
                        // an `error` message carries its text in a header
                        (Some(m), "error") => {
                            serde_json::to_vec(&serde_json::json!({ "message": m }))
                                .unwrap_or_default()
                        }
                        _ => f.payload,
                    };
                    let r = self
                        .chunks
                        .push(&f.kind, exception, &payload, &mut self.scratch);
                    self.ready.extend(self.scratch.drain(..));
                    if let Err(e) = r {
                        self.broken = Some(e.message);
                        return;
                    }
                }
                Ok(None) => return,
                Err(e) => {
                    self.broken = Some(e);
                    return;
                }
            }
        }
    }

    /// The body ended (framed): finish a stream that said `messageStop`.
    pub fn finish(&mut self) {
        if self.broken.is_none() && !self.chunks.finish(&mut self.scratch) {
            self.broken = Some("the upstream stream ended before its last event".into());
        }
        self.ready.extend(self.scratch.drain(..));
    }

    /// The next Chat event, then (once they are out) why the stream broke.
    pub fn next_event(&mut self) -> Result<Option<SseEvent>, String> {
        if let Some(e) = self.ready.pop_front() {
            return Ok(Some(e));
        }
        match self.broken.take() {
            Some(e) => Err(e),
            None => Ok(None),
        }
    }

    pub fn pending_bytes(&self) -> usize {
        self.frames.pending_bytes()
    }
}
