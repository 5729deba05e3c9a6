//! The Gemini dialect's request targets, as the `google-genai` SDKs and Google's REST docs
//! write them: `POST /v1beta/models/{model}:generateContent`, `:streamGenerateContent?alt=sse`
//! and `:countTokens` — also under `/v1/` (the Python SDK's default version with a custom
//! `base_url`) — and the model lookups `GET /v1beta/models` and `GET /{v1,v1beta}/models/{id}`.
//! A Gemini body names neither its model nor whether it streams: both come from the path, so
//! they are read here, on the head, before the body.
//!
//! The model is the part between `/models/` and the last `:` (model names may hold `:` and `/`
//! themselves), percent-decoded once and held to the model identifier rule
//! (`upstream::target::model_from_path`); streams are served as SSE only (`alt=sse`, what every
//! SDK asks for), anything else is a clear 400.
//!
//! Owns: recognising these paths and the `Call` they name. Must not: read the body, route, or
//! decide shapes of answers (`models` renders model lookups).

use crate::dialect::op::Op;
use crate::error::{Error, Kind};
use crate::http::target::{model_from_path, MODEL_RULE};

/// What a Gemini-style path asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route<'p> {
    /// `…/models/{model}:generateContent` (`stream` false), `:streamGenerateContent` (true) or
    /// `:countTokens` (`Op::CountTokens`).
    Call {
        model: &'p [u8],
        op: Op,
        stream: bool,
    },
    /// `…/models/{id}` without a known method: a model lookup (every dialect's SDK).
    Model(&'p [u8]),
    /// `/v1beta/models`: Gemini's model list (`/v1/models` is the shared list path).
    List,
}

/// A Gemini generation or token count, as the path names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// The client's model name (validated).
    pub model: String,
    pub stream: bool,
}

/// The route of `path` (without its query), if it is one of the paths above.
pub fn route(path: &[u8]) -> Option<Route<'_>> {
    if path == b"/v1beta/models" {
        return Some(Route::List);
    }
    let rest = path
        .strip_prefix(b"/v1beta/models/")
        .or_else(|| path.strip_prefix(b"/v1/models/"))?;
    let call = |model, op, stream| Some(Route::Call { model, op, stream });
    if let Some(colon) = memchr::memrchr(b':', rest) {
        let model = &rest[..colon];
        match &rest[colon + 1..] {
            b"generateContent" => return call(model, Op::Generate, false),
            b"streamGenerateContent" => return call(model, Op::Generate, true),
            b"countTokens" => return call(model, Op::CountTokens, false),
            _ => {}
        }
    }
    Some(Route::Model(rest))
}

/// Whether errors on `path` are answered in Gemini's shape before (or without) a route: the
/// `/v1beta/` prefix, or a model method call under `/v1/models/`.
pub fn is_gemini_path(path: &[u8]) -> bool {
    path.starts_with(b"/v1beta/") || matches!(route(path), Some(Route::Call { .. }))
}

/// The call `path` names (its route must be `Route::Call`), with `query` checked for
/// `alt=sse` on streams. 400 for an invalid model or a stream asked for in another format.
pub fn call(path: &[u8], query: Option<&[u8]>) -> Result<Call, Error> {
    let Some(Route::Call { model, stream, .. }) = route(path) else {
        return Err(Error::new(Kind::NotFound, "not a Gemini model method path"));
    };
    let model = model_from_path(model).map_err(|why| {
        Error::new(
            Kind::InvalidBody,
            format!(
                "the model in the request path is not a valid model name: it {why}; {MODEL_RULE}"
            ),
        )
    })?;
    if stream && !has_param(query, b"alt", b"sse") {
        return Err(Error::new(
            Kind::InvalidBody,
            "streamGenerateContent is served as server-sent events only: add `?alt=sse`",
        ));
    }
    Ok(Call { model, stream })
}

/// Whether the query string holds `name=value` (exactly, unencoded).
fn has_param(query: Option<&[u8]>, name: &[u8], value: &[u8]) -> bool {
    query.is_some_and(|q| {
        q.split(|&b| b == b'&').any(|kv| {
            kv.len() == name.len() + 1 + value.len()
                && kv.starts_with(name)
                && kv[name.len()] == b'='
                && kv.ends_with(value)
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        let c = |m: &'static str, op, stream| {
            Some(Route::Call {
                model: m.as_bytes(),
                op,
                stream,
            })
        };
        assert_eq!(
            route(b"/v1beta/models/gemini-2.0-flash:generateContent"),
            c("gemini-2.0-flash", Op::Generate, false)
        );
        assert_eq!(
            route(b"/v1/models/g:streamGenerateContent"),
            c("g", Op::Generate, true)
        );
        assert_eq!(
            route(b"/v1/models/llama3:8b:countTokens"),
            c("llama3:8b", Op::CountTokens, false)
        );
        assert_eq!(
            route(b"/v1/models/org/m:generateContent"),
            c("org/m", Op::Generate, false)
        );
        assert_eq!(
            route(b"/v1/models/llama3:8b"),
            Some(Route::Model(b"llama3:8b"))
        );
        assert_eq!(route(b"/v1beta/models/g"), Some(Route::Model(b"g")));
        assert_eq!(route(b"/v1beta/models"), Some(Route::List));
        assert_eq!(route(b"/v1/models"), None);
        assert_eq!(route(b"/v1/chat/completions"), None);
        assert!(is_gemini_path(b"/v1beta/anything"));
        assert!(is_gemini_path(b"/v1/models/g:generateContent"));
        assert!(!is_gemini_path(b"/v1/models/g"));
        assert!(!is_gemini_path(b"/v1/messages"));
    }

    #[test]
    fn calls() {
        let ok = call(
            b"/v1beta/models/org%2Fm:streamGenerateContent",
            Some(b"alt=sse"),
        )
        .unwrap();
        assert_eq!((ok.model.as_str(), ok.stream), ("org/m", true));
        let ok = call(b"/v1/models/g:generateContent", Some(b"key=k")).unwrap();
        assert_eq!((ok.model.as_str(), ok.stream), ("g", false));
        assert!(call(
            b"/v1/models/g:streamGenerateContent",
            Some(b"alt=sse&key=k")
        )
        .is_ok());
        for (path, query) in [
            (&b"/v1/models/g:streamGenerateContent"[..], None),
            (
                b"/v1/models/g:streamGenerateContent",
                Some(&b"alt=json"[..]),
            ),
            (b"/v1/models/g:streamGenerateContent", Some(b"alt=ssex")),
            (b"/v1/models/a%20b:generateContent", None),
            (b"/v1/models/..:generateContent", None),
            (b"/v1/models/:generateContent", None),
            (b"/v1/models/a%0D%0AHost:%20x:generateContent", None),
        ] {
            let e = call(path, query).unwrap_err();
            assert_eq!(e.status(), 400, "{:?}", String::from_utf8_lossy(path));
        }
        assert_eq!(call(b"/v1/models/g", None).unwrap_err().status(), 404);
    }
}
