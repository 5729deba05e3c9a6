//! The OpenAI surface beyond chat, passed through to OpenAI-style providers (`openai`,
//! `openai-compatible`): `/v1/files` (upload, list, retrieve, content, delete), `/v1/batches`
//! (create, list, retrieve, cancel), `/v1/audio/transcriptions`, `/translations` and `/speech`,
//! `/v1/images/generations` and `/edits`, `/v1/moderations`, `/v1/rerank`.
//!
//! Bodies by what routing needs of them (`Body`):
//! - none (`GET`, `DELETE`), or a streamed upload (`POST /v1/files`): routing reads nothing of
//!   the body, which is forwarded as it arrives through one window of the memory budget
//!   (`pump`): admission on the declared length against `[admission] max_upload`, then
//!   back-pressure (the next bytes are read from the client only when the upstream took the
//!   last ones);
//! - multipart with a `model` field (transcriptions, translations, image edits): the field is
//!   read from the first parts within a bounded prefix (`http::multipart`), then the rest is
//!   streamed the same way;
//! - JSON (batch create, speech, image generations, moderations, rerank): read whole, within
//!   `max_body`, as every JSON request is.
//!
//! Routing: a model goes where the route table sends it (its first deployment on an
//! OpenAI-style provider; the model name is rewritten to its `upstream_model`); requests that
//! name no model go to `[routing] files_provider` (else the one OpenAI-style provider); a file
//! or batch id goes back to the provider that issued it (`ids`). No retries or fallbacks here:
//! a streamed body cannot be sent twice.
//!
//! Owns: `Call` (which endpoint), its classification from the head, and serving it (`serve`).
//! Must not: translate dialects, buffer a streamed body, or answer in anything but OpenAI's
//! shape.

pub mod ids;
pub mod pump;
pub mod serve;

use crate::error::{Error, Kind};
use crate::http::Method;
use crate::observe::trace::Endpoint;

/// Which surface endpoint a request head names (ids are read from the path by `serve`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    /// `GET` (list) or `POST` (upload) `/v1/files`.
    Files,
    /// `GET` or `DELETE` `/v1/files/{id}`.
    File,
    /// `GET /v1/files/{id}/content`.
    FileContent,
    /// `GET` (list) or `POST` (create) `/v1/batches`.
    Batches,
    /// `GET /v1/batches/{id}`.
    Batch,
    /// `POST /v1/batches/{id}/cancel`.
    BatchCancel,
    Transcriptions,
    Translations,
    Speech,
    ImageGenerations,
    ImageEdits,
    Moderations,
    Rerank,
}

/// How a call's body is read before routing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Body {
    /// Nothing to read for routing: forwarded as it arrives (if there is one).
    Stream,
    /// A multipart body whose `model` field routes it.
    Multipart,
    /// A JSON body read whole (`max_body`).
    Json,
}

impl Call {
    /// The body rule of this call with `method`.
    pub fn body(self, method: Method) -> Body {
        match self {
            Call::Transcriptions | Call::Translations | Call::ImageEdits => Body::Multipart,
            Call::Batches if method == Method::Post => Body::Json,
            Call::Speech | Call::ImageGenerations | Call::Moderations | Call::Rerank => Body::Json,
            _ => Body::Stream,
        }
    }

    /// Metrics and access-log endpoint.
    pub fn endpoint(self) -> Endpoint {
        match self {
            Call::Files | Call::File | Call::FileContent => Endpoint::Files,
            Call::Batches | Call::Batch | Call::BatchCancel => Endpoint::Batches,
            Call::Transcriptions | Call::Translations | Call::Speech => Endpoint::Audio,
            Call::ImageGenerations | Call::ImageEdits => Endpoint::Images,
            Call::Moderations => Endpoint::Moderations,
            Call::Rerank => Endpoint::Rerank,
        }
    }

    fn methods(self) -> &'static [Method] {
        match self {
            Call::Files | Call::Batches => &[Method::Get, Method::Post],
            Call::File => &[Method::Get, Method::Delete],
            Call::FileContent | Call::Batch => &[Method::Get],
            _ => &[Method::Post],
        }
    }
}

/// The surface call a request path names (`None`: not a surface path), with its method
/// checked (405 otherwise).
pub fn classify(method: Method, path: &[u8]) -> Option<Result<Call, Error>> {
    let p = path.strip_prefix(b"/v1").unwrap_or(path);
    let call = match p {
        b"/files" => Call::Files,
        b"/batches" => Call::Batches,
        b"/audio/transcriptions" => Call::Transcriptions,
        b"/audio/translations" => Call::Translations,
        b"/audio/speech" => Call::Speech,
        b"/images/generations" => Call::ImageGenerations,
        b"/images/edits" => Call::ImageEdits,
        b"/moderations" => Call::Moderations,
        b"/rerank" => Call::Rerank,
        _ => {
            let (call, _) = with_id(p)?;
            call
        }
    };
    if !call.methods().contains(&method) {
        return Some(Err(Error::new(
            Kind::MethodNotAllowed,
            "method not allowed on this path",
        )));
    }
    Some(Ok(call))
}

/// Longest file or batch id accepted.
pub const MAX_ID: usize = 128;

/// `/files/{id}`, `/files/{id}/content`, `/batches/{id}`, `/batches/{id}/cancel` (below `/v1`):
/// the call and the raw id segment (checked by [`check_id`]).
fn with_id(p: &[u8]) -> Option<(Call, &[u8])> {
    let (one, rest) = if let Some(r) = p.strip_prefix(b"/files/") {
        (Call::File, r)
    } else {
        (Call::Batch, p.strip_prefix(b"/batches/")?)
    };
    let (id, tail) = match rest.iter().position(|&b| b == b'/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, &b""[..]),
    };
    let call = match (one, tail) {
        (c, b"") => c,
        (Call::File, b"/content") => Call::FileContent,
        (Call::Batch, b"/cancel") => Call::BatchCancel,
        _ => return None,
    };
    Some((call, id))
}

/// The id in a surface path, held to `A-Z a-z 0-9 _ -` and at most [`MAX_ID`] bytes: what
/// OpenAI's ids are made of, so it goes into the upstream path as it is (no escaping needed, and
/// nothing else gets through).
pub fn id_in(path: &[u8]) -> Result<Option<&str>, Error> {
    let p = path.strip_prefix(b"/v1").unwrap_or(path);
    let Some((_, id)) = with_id(p) else {
        return Ok(None);
    };
    check_id(id).map(Some)
}

/// An id by the rule of [`id_in`]; `Err` is a 400 in OpenAI's shape.
pub fn check_id(id: &[u8]) -> Result<&str, Error> {
    let ok = !id.is_empty()
        && id.len() <= MAX_ID
        && id
            .iter()
            .all(|&b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    match std::str::from_utf8(id) {
        Ok(s) if ok => Ok(s),
        _ => Err(Error::new(
            Kind::InvalidBody,
            format!("invalid id: an id is 1 to {MAX_ID} characters from A-Z a-z 0-9 _ -"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_and_methods() {
        let c = |m, p: &str| classify(m, p.as_bytes()).map(|r| r.map_err(|e| e.status()));
        assert_eq!(c(Method::Post, "/v1/files"), Some(Ok(Call::Files)));
        assert_eq!(c(Method::Get, "/files"), Some(Ok(Call::Files)));
        assert_eq!(c(Method::Delete, "/v1/files/file-1"), Some(Ok(Call::File)));
        assert_eq!(
            c(Method::Get, "/v1/files/file-1/content"),
            Some(Ok(Call::FileContent))
        );
        assert_eq!(
            c(Method::Post, "/v1/batches/b_1/cancel"),
            Some(Ok(Call::BatchCancel))
        );
        assert_eq!(c(Method::Post, "/v1/audio/speech"), Some(Ok(Call::Speech)));
        assert_eq!(c(Method::Get, "/v1/audio/speech"), Some(Err(405)));
        assert_eq!(c(Method::Post, "/v1/files/file-1/content"), Some(Err(405)));
        assert_eq!(c(Method::Get, "/v1/files/a/b"), None);
        assert_eq!(c(Method::Get, "/v1/chat/completions"), None);
    }

    #[test]
    fn ids_are_held_to_their_alphabet() {
        assert_eq!(id_in(b"/v1/files/file-abc_1").unwrap(), Some("file-abc_1"));
        assert_eq!(id_in(b"/v1/files").unwrap(), None);
        for bad in [
            &b"/v1/files/"[..],
            b"/v1/files/%2e%2e",
            b"/v1/files/..",
            b"/v1/files/a%0d%0ab",
            b"/v1/batches/a b",
            b"/v1/batches/\xff",
        ] {
            assert!(id_in(bad).is_err(), "{bad:?}");
        }
        let long = format!("/v1/files/{}", "a".repeat(MAX_ID + 1));
        assert!(id_in(long.as_bytes()).is_err());
    }
}
