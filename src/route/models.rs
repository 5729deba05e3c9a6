//! The gateway's model endpoints, answered the way each SDK reads them: `GET /v1/models` (the
//! list) and `GET /v1/models/{id}` (one model; also under `/v1beta/` for Gemini clients).
//!
//! | asked by | list | one model | unknown id |
//! | --- | --- | --- | --- |
//! | OpenAI SDKs (default) | `{"object":"list","data":[{"id","object":"model","created","owned_by"}]}` | the `data[]` object | 404 OpenAI shape, `model_not_found` |
//! | Anthropic SDKs (`anthropic-version` header) | `{"data":[{"type":"model","id","display_name","created_at"}],"has_more":false,"first_id","last_id"}` | the `data[]` object | 404 `not_found_error` |
//! | Gemini SDKs (`/v1beta/` path, or `x-goog-api-key` / `?key=`) | `{"models":[{"name":"models/<id>","displayName","supportedGenerationMethods"}]}` | the `models[]` object | 404 `NOT_FOUND` |
//!
//! Lists hold the configured exact model names in config order (a `prefix*` pattern cannot be
//! listed); a lookup answers for any name that routes (exact, or through a pattern) and is a
//! valid model name. Creation times are not known: `0` / the Unix epoch. Pagination parameters
//! are ignored: the whole list is one page.
//!
//! Owns: `Shape` (which SDK asks), the list bodies (built once per route table) and the lookup
//! bodies. Must not: route requests or check keys (the pipeline gates these endpoints).

use crate::error::{push_json_str, Error, ErrorShape, Kind};
use crate::http::target::model_from_path;
use crate::http::RequestHead;
use crate::route::Route;

/// Which SDK's shape a model endpoint answers in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    OpenAi,
    Anthropic,
    Gemini,
}

impl Shape {
    /// Decided on the request head (`path` without its query): `/v1beta/` is Gemini's; else an
    /// `anthropic-version` header means the Anthropic SDK, an `x-goog-api-key` header or a
    /// `key=` query parameter a Gemini client, anything else OpenAI's.
    pub fn of(path: &[u8], head: &RequestHead, buf: &[u8]) -> Shape {
        let query_key = head
            .query(buf)
            .is_some_and(|q| q.split(|&b| b == b'&').any(|kv| kv.starts_with(b"key=")));
        if path.starts_with(b"/v1beta/") {
            Shape::Gemini
        } else if head.anthropic_version.is_some() {
            Shape::Anthropic
        } else if head.x_goog_api_key.is_some() || query_key {
            Shape::Gemini
        } else {
            Shape::OpenAi
        }
    }

    /// The error shape of the same SDK.
    pub fn errors(self) -> ErrorShape {
        match self {
            Shape::OpenAi => ErrorShape::OpenAi,
            Shape::Anthropic => ErrorShape::Anthropic,
            Shape::Gemini => ErrorShape::Gemini,
        }
    }
}

/// A model endpoint request, read from the head: the shape, and the id of a lookup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ask {
    pub shape: Shape,
    /// `Some`: one model (`Err`: the path's id is not a valid model name: 404).
    pub id: Option<Result<String, &'static str>>,
}

impl Ask {
    /// `id_bytes`: the path part naming one model (`None` for the list).
    pub fn of(head: &RequestHead, buf: &[u8], id_bytes: Option<&[u8]>) -> Ask {
        let path = head.path(buf);
        Ask {
            shape: Shape::of(path, head, buf),
            // A Gemini SDK names models `models/<id>` in bodies, but in paths just `<id>`;
            // accept both.
            id: id_bytes.map(|b| model_from_path(b.strip_prefix(b"models/").unwrap_or(b))),
        }
    }
}

/// The three list bodies of one route table.
#[derive(Debug, Default)]
pub struct Catalog {
    openai: Vec<u8>,
    anthropic: Vec<u8>,
    gemini: Vec<u8>,
}

impl Catalog {
    /// The lists of `routes`' exact model names (patterns skipped), in order.
    pub fn build(routes: &[Route]) -> Catalog {
        let listed: Vec<(&str, &str)> = routes
            .iter()
            .filter(|r| !r.name.ends_with('*') && !r.retired)
            .map(|r| (r.name.as_str(), r.provider.name.as_str()))
            .collect();
        let mut c = Catalog::default();
        let mut lists = [
            (Shape::OpenAi, &mut c.openai),
            (Shape::Anthropic, &mut c.anthropic),
            (Shape::Gemini, &mut c.gemini),
        ];
        for (shape, out) in &mut lists {
            out.extend_from_slice(match shape {
                Shape::OpenAi => b"{\"object\":\"list\",\"data\":[",
                Shape::Anthropic => b"{\"data\":[",
                Shape::Gemini => b"{\"models\":[",
            });
            for (i, (id, owner)) in listed.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                push_model(out, *shape, id, owner);
            }
            out.push(b']');
            if *shape == Shape::Anthropic {
                out.extend_from_slice(b",\"has_more\":false,\"first_id\":");
                push_id_or_null(out, listed.first().map(|m| m.0));
                out.extend_from_slice(b",\"last_id\":");
                push_id_or_null(out, listed.last().map(|m| m.0));
            }
            out.push(b'}');
        }
        c
    }

    /// The list body in `shape`.
    pub fn list(&self, shape: Shape) -> &[u8] {
        match shape {
            Shape::OpenAi => &self.openai,
            Shape::Anthropic => &self.anthropic,
            Shape::Gemini => &self.gemini,
        }
    }
}

/// The body for one model: `route` is what `id` resolves to (`None`: not routed). 404
/// (`Kind::UnknownModel`) for an unknown or invalid id.
pub fn one(shape: Shape, id: Result<&str, &str>, route: Option<&Route>) -> Result<Vec<u8>, Error> {
    let (id, route) = match (id, route) {
        (Ok(id), Some(r)) => (id, r),
        (Ok(id), None) => {
            return Err(Error::new(
                Kind::UnknownModel,
                format!("The model `{id}` does not exist or is not routed by this gateway"),
            ))
        }
        (Err(why), _) => {
            return Err(Error::new(
                Kind::UnknownModel,
                format!("no such model: the model in the request path {why}"),
            ))
        }
    };
    let mut out = Vec::with_capacity(160 + 2 * id.len());
    push_model(&mut out, shape, id, &route.provider.name);
    Ok(out)
}

fn push_id_or_null(out: &mut Vec<u8>, id: Option<&str>) {
    match id {
        Some(id) => push_json_str(out, id),
        None => out.extend_from_slice(b"null"),
    }
}

/// One model object in `shape`.
fn push_model(out: &mut Vec<u8>, shape: Shape, id: &str, owner: &str) {
    match shape {
        Shape::OpenAi => {
            out.extend_from_slice(b"{\"id\":");
            push_json_str(out, id);
            out.extend_from_slice(b",\"object\":\"model\",\"created\":0,\"owned_by\":");
            push_json_str(out, owner);
        }
        Shape::Anthropic => {
            out.extend_from_slice(b"{\"type\":\"model\",\"id\":");
            push_json_str(out, id);
            out.extend_from_slice(b",\"display_name\":");
            push_json_str(out, id);
            out.extend_from_slice(b",\"created_at\":\"1970-01-01T00:00:00Z\"");
        }
        Shape::Gemini => {
            out.extend_from_slice(b"{\"name\":");
            push_json_str(out, &format!("models/{id}"));
            out.extend_from_slice(b",\"displayName\":");
            push_json_str(out, id);
            out.extend_from_slice(
                b",\"supportedGenerationMethods\":[\"generateContent\",\"streamGenerateContent\",\"countTokens\"]",
            );
        }
    }
    out.push(b'}');
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::http::head::parse;
    use crate::route::RouteTable;
    use serde_json::Value;

    fn table() -> RouteTable {
        let cfg = Config::parse(
            "[[provider]]\nname = \"p\"\nkind = \"mock\"\n\
             [[model]]\nname = \"a\"\nprovider = \"p\"\n\
             [[model]]\nname = \"gpt-*\"\nprovider = \"p\"\n\
             [[model]]\nname = \"org/b\"\nprovider = \"p\"\n",
        )
        .unwrap();
        RouteTable::build(&cfg)
    }

    fn json(b: &[u8]) -> Value {
        serde_json::from_slice(b).unwrap()
    }

    #[test]
    fn lists_in_each_shape() {
        let c = Catalog::build(table().routes());
        let o = json(c.list(Shape::OpenAi));
        assert_eq!(o["object"], "list");
        assert_eq!(o["data"][1]["id"], "org/b");
        assert_eq!(o["data"][0]["owned_by"], "p");
        assert_eq!(
            o["data"].as_array().unwrap().len(),
            2,
            "patterns are not listed"
        );
        let a = json(c.list(Shape::Anthropic));
        assert_eq!(a["data"][0]["type"], "model");
        assert_eq!(a["data"][0]["display_name"], "a");
        assert_eq!(a["data"][0]["created_at"], "1970-01-01T00:00:00Z");
        assert_eq!(
            (&a["has_more"], &a["first_id"], &a["last_id"]),
            (
                &Value::Bool(false),
                &Value::from("a"),
                &Value::from("org/b")
            )
        );
        let g = json(c.list(Shape::Gemini));
        assert_eq!(g["models"][1]["name"], "models/org/b");
        let empty = json(Catalog::build(&[]).list(Shape::Anthropic));
        assert_eq!(
            (&empty["first_id"], &empty["last_id"]),
            (&Value::Null, &Value::Null)
        );
    }

    #[test]
    fn one_model_or_404() {
        let t = table();
        let o = json(&one(Shape::OpenAi, Ok("gpt-4o"), t.resolve("gpt-4o")).unwrap());
        assert_eq!(
            (&o["id"], &o["object"]),
            (&Value::from("gpt-4o"), &Value::from("model"))
        );
        let g = json(&one(Shape::Gemini, Ok("a"), t.resolve("a")).unwrap());
        assert_eq!(g["name"], "models/a");
        let e = one(Shape::Anthropic, Ok("nope"), t.resolve("nope")).unwrap_err();
        assert_eq!(e.status(), 404);
        let v = json(&e.body(Shape::Anthropic.errors()));
        assert_eq!(v["error"]["type"], "not_found_error");
        assert_eq!(
            one(Shape::OpenAi, Err("is empty"), None)
                .unwrap_err()
                .status(),
            404
        );
    }

    #[test]
    fn shape_follows_the_sdk() {
        let shape = |raw: &str| {
            let h = parse(raw.as_bytes(), 4096, 64).unwrap().unwrap();
            Shape::of(h.path(raw.as_bytes()), &h, raw.as_bytes())
        };
        let get = |p: &str, h: &str| format!("GET {p} HTTP/1.1\r\nHost: a\r\n{h}\r\n");
        assert_eq!(shape(&get("/v1/models", "")), Shape::OpenAi);
        assert_eq!(
            shape(&get("/v1/models", "authorization: Bearer k\r\n")),
            Shape::OpenAi
        );
        assert_eq!(
            shape(&get(
                "/v1/models",
                "anthropic-version: 2023-06-01\r\nx-api-key: k\r\n"
            )),
            Shape::Anthropic
        );
        assert_eq!(
            shape(&get("/v1/models", "x-goog-api-key: k\r\n")),
            Shape::Gemini
        );
        assert_eq!(shape(&get("/v1/models?key=k", "")), Shape::Gemini);
        assert_eq!(shape(&get("/v1beta/models", "")), Shape::Gemini);
        let raw = get("/v1beta/models/models%2Fa", "");
        let h = parse(raw.as_bytes(), 4096, 64).unwrap().unwrap();
        let ask = Ask::of(&h, raw.as_bytes(), Some(b"a"));
        assert_eq!(
            (ask.shape, ask.id),
            (Shape::Gemini, Some(Ok("a".to_string())))
        );
    }
}
