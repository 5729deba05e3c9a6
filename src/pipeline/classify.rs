//! What a request head asks for: the path and method mapped to a `Target` before any body byte
//! is read.
//!
//! Owns: `Target`, `classify`, `Api` (a provider call as its head names it), `model_id_in`.
//! Must not: parse the body (`Api::fields` hands it to `dialect::extract`), read the config or
//! the shard.

use crate::config::provider::Op;
use crate::dialect::extract::{self, RoutingFields};
use crate::dialect::{gemini::call as gemini_call, Dialect};
use crate::error::{Error, Kind};
use crate::governance::Gate;
use crate::http::{Method, RequestHead};

/// What a request head asks for, decided before any body byte is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// A provider API call in the client's dialect.
    Api(Dialect, Op),
    /// The model list (`GET /v1/models`, `/v1beta/models`).
    Models,
    /// One model (`GET /v1/models/{id}`, `/v1beta/models/{id}`).
    Model,
    Healthz,
    Readyz,
    Metrics,
    /// `/mcp`: the MCP gateway (`mcp::serve`).
    Mcp,
    /// Files, batches, audio, images, moderations, rerank (`surface::serve`).
    Surface(crate::surface::Call),
}

impl Target {
    /// What the caller's virtual key must allow (see `governance`).
    pub fn gate(self) -> Gate {
        match self {
            Target::Api(..) | Target::Mcp | Target::Surface(_) => Gate::Limits,
            Target::Models | Target::Model => Gate::Key,
            Target::Healthz | Target::Readyz | Target::Metrics => Gate::Open,
        }
    }
}

pub fn classify(method: Method, path: &[u8]) -> Result<Target, Error> {
    let target = match path {
        b"/v1/chat/completions" | b"/chat/completions" => Target::Api(Dialect::Chat, Op::Generate),
        b"/v1/responses" | b"/responses" => Target::Api(Dialect::Responses, Op::Generate),
        b"/v1/messages" => Target::Api(Dialect::Messages, Op::Generate),
        b"/v1/messages/count_tokens" => Target::Api(Dialect::Messages, Op::CountTokens),
        b"/v1/embeddings" | b"/embeddings" => Target::Api(Dialect::Chat, Op::Embeddings),
        b"/v1/completions" | b"/completions" => Target::Api(Dialect::Chat, Op::Completions),
        b"/v1/models" | b"/models" => Target::Models,
        b"/healthz" => Target::Healthz,
        b"/readyz" => Target::Readyz,
        b"/metrics" => Target::Metrics,
        // every method: `mcp::serve` answers GET and others with 405 in JSON-RPC's shape
        b"/mcp" => return Ok(Target::Mcp),
        // files, batches, audio, images, …: after the chat paths (which it costs nothing)
        _ => match crate::surface::classify(method, path) {
            Some(c) => return c.map(Target::Surface),
            None => gemini_or_none(method, path)?,
        },
    };
    let want = if matches!(target, Target::Api(..)) {
        Method::Post
    } else {
        Method::Get
    };
    if method != want {
        return Err(Error::new(
            Kind::MethodNotAllowed,
            "method not allowed on this path",
        ));
    }
    Ok(target)
}

/// A provider API call (`Target::Api`) as its head names it: the client's dialect, the
/// operation, and a Gemini call's model and stream choice (in its path: its body names
/// neither). Built once by the pipeline; the routing fields and the guardrails read it.
#[derive(Debug)]
pub struct Api {
    pub dialect: Dialect,
    pub op: Op,
    pub gemini: Option<gemini_call::Call>,
}

impl Api {
    /// The call `head` (in `buf`) names, classified as `Target::Api(dialect, op)`; a Gemini
    /// path's model and `alt=sse` checked (400).
    pub fn of(dialect: Dialect, op: Op, head: &RequestHead, buf: &[u8]) -> Result<Api, Error> {
        let gemini = (dialect == Dialect::Gemini)
            .then(|| gemini_call::call(head.path(buf), head.query(buf)))
            .transpose()?;
        Ok(Api {
            dialect,
            op,
            gemini,
        })
    }

    /// The routing fields of `body` (a Gemini call's model and stream from its path).
    pub fn fields(&self, body: &[u8]) -> Result<RoutingFields, Error> {
        match &self.gemini {
            Some(call) => extract::gemini_fields(body, call),
            None => extract::routing_fields(body),
        }
    }
}

/// A Gemini path's target, else 404.
fn gemini_or_none(method: Method, path: &[u8]) -> Result<Target, Error> {
    Ok(match gemini_call::route(path) {
        Some(gemini_call::Route::Call { op, .. }) => Target::Api(Dialect::Gemini, op),
        Some(gemini_call::Route::Model(_)) if method == Method::Get => Target::Model,
        Some(gemini_call::Route::List) => Target::Models,
        _ => {
            return Err(Error::new(
                Kind::NotFound,
                format!("no route for {}", String::from_utf8_lossy(path)),
            ))
        }
    })
}

/// The id part of a model lookup path (`/v1/models/{id}`, `/v1beta/models/{id}`).
pub fn model_id_in(path: &[u8]) -> Option<&[u8]> {
    match gemini_call::route(path) {
        Some(gemini_call::Route::Model(id)) => Some(id),
        _ => None,
    }
}
