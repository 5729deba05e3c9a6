//! Planning one upstream attempt: (provider, upstream model, op, client dialect, body) → the
//! upstream request (target, dialect, spliced or translated body, quirks) and how its answer
//! comes back to the client (byte-for-byte passthrough, or translated through the hub).
//!
//! Usage of Chat streams: OpenAI-style upstreams report a stream's usage only when asked
//! (`stream_options.include_usage`). A metered (keyed) Chat stream whose client did not ask is
//! sent with
//! `"stream_options":{"include_usage":true}` spliced in (the rest of the body byte for byte),
//! and its answer is relayed with the extra usage-only chunk (`choices: []` with `usage`)
//! taken out (`Mode::Passthrough { strip_usage }`, see `relay`), so the gateway counts every
//! stream's tokens and the client sees what it asked for. Translated requests to a Chat
//! upstream always ask (`dialect::chat_to_request`). The `no_stream_options` quirk turns
//! both off (such streams keep their token estimate).
//!
//! Owns: the one decision per provider kind of *what* to send (the dispatch `match` on
//! `ProviderKind` for a request). Must not: do IO, choose deployments (that is `forward`), or
//! write to the client (that is `respond`). Pure: unit-tested without sockets.

use std::borrow::Cow;

use crate::config::provider::{Op, ProviderKind};
use crate::dialect::extensions::ChatUpstream;
use crate::dialect::extract::{splice, RoutingFields, UsageOption};
use crate::dialect::{self, Dialect};
use crate::error::{Error, Kind};
use crate::route::Provider;

/// How the upstream's answer reaches the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Same dialect: relayed as it arrives (SSE per whole event). `strip_usage`: the
    /// gateway asked for the usage chunk, the client did not: it is taken out.
    Passthrough { strip_usage: bool },
    /// Another dialect: translated back through the hub (`up` is what the upstream speaks).
    /// `converse`: the upstream is Bedrock's Converse (`up` is then the hub, Chat: its JSON
    /// answers and event-stream frames convert to Chat first, `dialect::converse`).
    Translate {
        up: Dialect,
        include_usage: bool,
        converse: bool,
    },
}

/// Where the attempt goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// An HTTP upstream: the request target below the provider's endpoint.
    Http { path: String },
    /// The in-process mock provider, answering in the client's dialect.
    Mock,
    /// Answered by the gateway itself (a 200 JSON body), e.g. a token-count estimate for
    /// providers that have no exact count endpoint.
    Local(Vec<u8>),
}

/// One planned upstream request.
#[derive(Debug)]
pub struct Plan<'b> {
    pub mode: Mode,
    pub target: Target,
    /// The model name the upstream sees (borrowed: the deployment's or the client's).
    pub upstream_model: &'b str,
    /// The request body as sent: the client's bytes, spliced, or translated.
    pub body: Cow<'b, [u8]>,
}

/// What the client asked, as each attempt plans it: the client's dialect, the operation, the
/// body (a Responses request's with its references expanded when one was) and the body's
/// routing fields.
#[derive(Debug, Clone, Copy)]
pub struct Asked<'b> {
    pub client: Dialect,
    pub op: Op,
    pub body: &'b [u8],
    pub fields: &'b RoutingFields,
}

/// Plan the request `asked` for `provider` (serving `upstream_model`, or the client's name when
/// `None`). Errors are the client's (400: the body cannot be translated or the provider does
/// not offer `op`).
pub fn plan<'b>(
    provider: &Provider,
    upstream_model: Option<&'b str>,
    asked: Asked<'b>,
) -> Result<Plan<'b>, Error> {
    let Asked {
        client,
        op,
        body,
        fields,
    } = asked;
    let model: &'b str = upstream_model.unwrap_or(&fields.model);
    // Vertex serves each model in its publisher's wire format (Anthropic's or Gemini's)
    let kind = provider.kind.for_model(model, provider.publisher);
    let vertex = provider.kind == ProviderKind::Vertex;
    let passthrough = |target: Target, body: Cow<'b, [u8]>| Plan {
        mode: Mode::Passthrough { strip_usage: false },
        target,
        upstream_model: model,
        body,
    };
    // A metered Chat stream to an OpenAI-style upstream whose client did not ask for usage:
    // ask.
    let ask_usage = fields.metered
        && client == Dialect::Chat
        && op == Op::Generate
        && fields.stream
        && kind.native() == Dialect::Chat
        && !provider.no_stream_options
        && matches!(
            fields.usage_option,
            UsageOption::Absent | UsageOption::NotAsked(_)
        );
    // (A Gemini model lives in the URL, never in the body.)
    let rename = upstream_model.filter(|m| *m != fields.model && client != Dialect::Gemini);
    let path = |op: Op, dialect: Dialect| {
        if vertex && kind == ProviderKind::Anthropic {
            let base = provider.base_path();
            return crate::config::provider::vertex_anthropic_path(base, model, op, fields.stream);
        }
        let kind = if vertex { ProviderKind::Vertex } else { kind };
        kind.path(
            provider.base_path(),
            op,
            dialect,
            model,
            fields.stream,
            provider.api_version.as_deref(),
        )
    };
    match (kind, op) {
        (ProviderKind::Mock, _) if ask_usage => Ok(Plan {
            mode: Mode::Passthrough { strip_usage: true },
            ..passthrough(Target::Mock, Cow::Owned(splice(body, fields, None, true)))
        }),
        (ProviderKind::Mock, _) => Ok(passthrough(Target::Mock, Cow::Borrowed(body))),
        (kind, Op::CountTokens)
            if !kind.speaks(client) || (vertex && kind == ProviderKind::Anthropic) =>
        {
            // Only a provider of the client's own dialect counts exactly (Anthropic for
            // Messages, Gemini for Gemini); elsewhere answer with the documented estimate.
            let n = dialect::estimate_tokens(body);
            let out = match client {
                Dialect::Gemini => format!("{{\"totalTokens\":{n}}}"),
                _ => format!("{{\"input_tokens\":{n}}}"),
            };
            Ok(passthrough(
                Target::Local(out.into_bytes()),
                Cow::Borrowed(body),
            ))
        }
        (kind, Op::Embeddings) if !kind.speaks(Dialect::Chat) => Err(Error::new(
            Kind::InvalidBody,
            format!("provider kind {} does not offer embeddings", kind.as_str()),
        )),
        (kind, Op::Completions) if !kind.speaks(Dialect::Chat) => Err(Error::new(
            Kind::InvalidBody,
            format!(
                "provider kind {} does not offer /v1/completions (OpenAI-style providers do)",
                kind.as_str()
            ),
        )),
        (ProviderKind::Anthropic, op) if vertex && kind.speaks(client) => Ok(Plan {
            // Anthropic on Vertex: the model is in the path, the version in the body
            mode: Mode::Passthrough { strip_usage: false },
            ..passthrough(
                Target::Http {
                    path: path(op, client),
                },
                Cow::Owned(vertex_anthropic_body(body)?),
            )
        }),
        (kind, op) if kind.speaks(client) => {
            let body = if rename.is_some() || ask_usage {
                Cow::Owned(splice(body, fields, rename, ask_usage))
            } else {
                Cow::Borrowed(body)
            };
            Ok(Plan {
                mode: Mode::Passthrough {
                    strip_usage: ask_usage,
                },
                ..passthrough(
                    Target::Http {
                        path: path(op, client),
                    },
                    body,
                )
            })
        }
        (kind, _) => {
            let up = kind.native();
            let invalid = |e: dialect::TranslateError| Error::new(Kind::InvalidBody, e.message);
            let mut chat = dialect::request_to_chat(client, body).map_err(invalid)?;
            if client == Dialect::Gemini {
                // A Gemini body does not say whether it streams: the path did.
                if let Some(o) = chat.as_object_mut() {
                    o.insert("stream".into(), fields.stream.into());
                }
            }
            if up == Dialect::Chat {
                // What this Chat upstream takes of the hub's conventions (reasoning, cache
                // markers, top_k): OpenAI's own API only its documented fields.
                let to = match kind {
                    ProviderKind::OpenAi | ProviderKind::Azure => ChatUpstream::OpenAi,
                    _ => ChatUpstream::Compatible,
                };
                dialect::extensions::fit_chat_upstream(&mut chat, to);
            }
            let include_usage = chat
                .get("stream_options")
                .and_then(|o| o.get("include_usage"))
                .and_then(|v| v.as_bool())
                .unwrap_or(false);
            let converse = kind == ProviderKind::Bedrock;
            let mut out = if converse {
                dialect::converse::chat_to_request(&chat).map_err(invalid)?
            } else {
                dialect::chat_to_request(up, &chat, model).map_err(invalid)?
            };
            drop(chat);
            if up == Dialect::Chat && provider.no_stream_options {
                out = strip_stream_options(out);
            }
            if vertex && up == Dialect::Messages {
                out = vertex_anthropic_body(&out)?;
            }
            Ok(Plan {
                mode: Mode::Translate {
                    up,
                    include_usage,
                    converse,
                },
                target: Target::Http {
                    path: path(Op::Generate, up),
                },
                upstream_model: model,
                body: Cow::Owned(out),
            })
        }
    }
}

/// A Messages body for Anthropic on Vertex: without `model` (it is in the path), with
/// `anthropic_version` (`vertex-2023-10-16` unless the body names one), as Anthropic's Vertex
/// SDK sends it.
fn vertex_anthropic_body(body: &[u8]) -> Result<Vec<u8>, Error> {
    let bad =
        |e: serde_json::Error| Error::new(Kind::InvalidBody, format!("invalid JSON body: {e}"));
    let mut v: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(body).map_err(bad)?;
    v.shift_remove("model");
    if !v.contains_key("anthropic_version") {
        v.insert(
            "anthropic_version".into(),
            crate::config::provider::VERTEX_ANTHROPIC_VERSION.into(),
        );
    }
    serde_json::to_vec(&v).map_err(bad)
}

/// Quirk `no_stream_options`: engines that reject the field get the body without it.
fn strip_stream_options(body: Vec<u8>) -> Vec<u8> {
    match serde_json::from_slice::<serde_json::Value>(&body) {
        Ok(mut v) => {
            if let Some(o) = v.as_object_mut() {
                o.remove("stream_options");
            }
            serde_json::to_vec(&v).unwrap_or(body)
        }
        Err(_) => body,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::endpoint::Endpoint;
    use crate::dialect::extract::routing_fields;
    use crate::mock::Profile;

    fn provider(kind: ProviderKind, quirk: bool) -> Provider {
        Provider {
            name: "p".into(),
            index: 0,
            kind,
            endpoint: Endpoint::parse("http://127.0.0.1:1/v1").ok(),
            auth_headers: Vec::new(),
            keys: Vec::new(),
            mock_profile: Profile::Instant,
            api_version: None,
            no_stream_options: quirk,
            engine: None,
            cloud: None,
            publisher: None,
        }
    }

    /// The plan for a `kind` provider (without quirks); it must plan.
    fn planned<'b>(
        kind: ProviderKind,
        upstream_model: Option<&'b str>,
        op: Op,
        client: Dialect,
        body: &'b [u8],
        fields: &'b RoutingFields,
    ) -> Plan<'b> {
        let asked = Asked {
            client,
            op,
            body,
            fields,
        };
        plan(&provider(kind, false), upstream_model, asked).unwrap()
    }

    #[test]
    fn one_decision_per_kind() {
        let body = br#"{"model":"alias","stream":true,"messages":[{"role":"user","content":"hi"}],"stream_options":{"include_usage":true}}"#;
        let f = routing_fields(body).unwrap();
        let chat = Dialect::Chat;
        let plan_for = |kind, model, op, client| planned(kind, model, op, client, body, &f);

        let p = plan_for(ProviderKind::OpenAi, Some("real"), Op::Generate, chat);
        assert_eq!(p.mode, Mode::Passthrough { strip_usage: false });
        assert_eq!(
            p.target,
            Target::Http {
                path: "/v1/chat/completions".into()
            }
        );
        assert!(std::str::from_utf8(&p.body)
            .unwrap()
            .starts_with(r#"{"model":"real","stream":true"#));

        let p = plan_for(ProviderKind::OpenAi, None, Op::Generate, chat);
        assert!(
            matches!(p.body, Cow::Borrowed(_)),
            "no splice without a rename"
        );

        let p = plan_for(ProviderKind::Anthropic, Some("claude"), Op::Generate, chat);
        assert_eq!(
            p.mode,
            Mode::Translate {
                up: Dialect::Messages,
                include_usage: true,
                converse: false,
            }
        );
        let v: serde_json::Value = serde_json::from_slice(&p.body).unwrap();
        assert_eq!(v["model"], "claude");

        let p = plan_for(ProviderKind::Mock, None, Op::Generate, Dialect::Messages);
        assert_eq!(
            (p.mode, p.target),
            (Mode::Passthrough { strip_usage: false }, Target::Mock)
        );

        let p = plan_for(
            ProviderKind::OpenAi,
            None,
            Op::CountTokens,
            Dialect::Messages,
        );
        assert!(matches!(p.target, Target::Local(_)));

        let asked = Asked {
            client: chat,
            op: Op::Embeddings,
            body,
            fields: &f,
        };
        let e = plan(&provider(ProviderKind::Anthropic, false), None, asked).unwrap_err();
        assert_eq!(e.status(), 400);
    }

    #[test]
    fn chat_streams_ask_for_usage_the_client_did_not_ask_for() {
        let plan_of = |body: &[u8], quirk: bool, kind: ProviderKind, rename: Option<&str>| {
            let mut f = routing_fields(body).unwrap();
            f.metered = true;
            let asked = Asked {
                client: Dialect::Chat,
                op: Op::Generate,
                body,
                fields: &f,
            };
            let p = plan(&provider(kind, quirk), rename, asked).unwrap();
            (p.mode, String::from_utf8(p.body.to_vec()).unwrap())
        };
        let strip = Mode::Passthrough { strip_usage: true };
        let keep = Mode::Passthrough { strip_usage: false };
        let absent = br#" {"model":"a","stream":true,"messages":[]}"#;
        assert_eq!(
            plan_of(absent, false, ProviderKind::OpenAi, Some("b")),
            (
                strip,
                r#" {"stream_options":{"include_usage":true},"model":"b","stream":true,"messages":[]}"#
                    .to_string()
            )
        );
        for kind in [
            ProviderKind::OpenAiCompatible,
            ProviderKind::Azure,
            ProviderKind::Mock,
        ] {
            assert_eq!(plan_of(absent, false, kind, None).0, strip, "{kind:?}");
        }
        let other =
            br#"{"model":"a","stream":true,"stream_options":{"x":1,"include_usage":false}}"#;
        assert_eq!(
            plan_of(other, false, ProviderKind::OpenAi, None),
            (
                strip,
                r#"{"model":"a","stream":true,"stream_options":{"x":1,"include_usage":true}}"#
                    .to_string()
            )
        );
        let null = br#"{"model":"a","stream_options":null,"stream":true}"#;
        assert_eq!(
            plan_of(null, false, ProviderKind::OpenAi, None).1,
            r#"{"model":"a","stream_options":{"include_usage":true},"stream":true}"#
        );
        // not metered (keys off): nothing to count, the body as sent
        let f = routing_fields(absent).unwrap();
        let p = planned(
            ProviderKind::OpenAi,
            None,
            Op::Generate,
            Dialect::Chat,
            absent,
            &f,
        );
        assert_eq!((p.mode, &*p.body), (keep, &absent[..]));
        // asked, not a stream, the quirk, a duplicate: the body as sent
        for (body, quirk) in [
            (
                &br#"{"model":"a","stream":true,"stream_options":{"include_usage":true}}"#[..],
                false,
            ),
            (br#"{"model":"a","stream":false}"#, false),
            (absent, true),
            (
                br#"{"model":"a","stream":true,"stream_options":{},"stream_options":{}}"#,
                false,
            ),
        ] {
            let (mode, out) = plan_of(body, quirk, ProviderKind::OpenAi, None);
            assert_eq!((mode, out.as_bytes()), (keep, body));
        }
    }

    #[test]
    fn quirk_strips_stream_options() {
        let out = strip_stream_options(
            br#"{"model":"m","stream":true,"stream_options":{"include_usage":true}}"#.to_vec(),
        );
        assert_eq!(out, br#"{"model":"m","stream":true}"#);
    }
}
