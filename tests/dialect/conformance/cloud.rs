//! The cloud providers' rows: every client dialect through a real gateway (in this process,
//! each of `common::variants()`) to a fake upstream on loopback that speaks Bedrock Converse
//! (JSON answers, ConverseStream as AWS event-stream frames with valid CRCs) and Vertex (a
//! metadata-server token, Gemini `generateContent` / `streamGenerateContent`, Anthropic
//! `rawPredict` / `streamRawPredict`). The fake answers with the matrix's own fixtures
//! (`upstream_response`, `upstream_stream`; Converse ones written here from the Bedrock API
//! reference) and records what it received, so the request cells check the upstream's view.
//! botocore's own check of the signatures is `tests/sdk/test_bedrock.py`; here the auth cell
//! checks that each request carries the provider's credential form.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use ringgate::dialect::Dialect;
use serde_json::{json, Value};

use super::common::{self, Variant};
use super::{client_request, has_image, has_system, name, read_body, read_stream, tool_ok};
use super::{upstream_response, upstream_stream, Summary};

const TOKEN: &str = "conformance-vertex-token";
const AKID: &str = "AKIDCONFORMANCE";

#[derive(Clone, Copy, PartialEq)]
enum Cloud {
    Bedrock,
    VertexGemini,
    VertexAnthropic,
}

const CLOUDS: [Cloud; 3] = [Cloud::Bedrock, Cloud::VertexGemini, Cloud::VertexAnthropic];

impl Cloud {
    fn label(self) -> &'static str {
        match self {
            Cloud::Bedrock => "Bedrock (Converse)",
            Cloud::VertexGemini => "Vertex Gemini",
            Cloud::VertexAnthropic => "Vertex Anthropic",
        }
    }
    /// The gateway's model name for a text or tool answer.
    fn model(self, tool: bool) -> String {
        let p = match self {
            Cloud::Bedrock => "bk",
            Cloud::VertexGemini => "vg",
            Cloud::VertexAnthropic => "va",
        };
        format!("{p}-{}", if tool { "tool" } else { "text" })
    }
}

fn config() -> String {
    let mut s = String::from(
        "[[provider]]\nname = \"aws\"\nkind = \"bedrock\"\nregion = \"us-east-1\"\nbase_url = \"http://UP\"\n\n\
         [[provider]]\nname = \"gcp\"\nkind = \"vertex\"\nproject = \"p\"\nlocation = \"us-central1\"\nbase_url = \"http://UP\"\n",
    );
    for tool in [false, true] {
        let t = if tool { "tool" } else { "text" };
        s.push_str(&format!(
            "\n[[model]]\nname = \"bk-{t}\"\nprovider = \"aws\"\nupstream_model = \"vendor.m-{t}-v1:0\"\n\
             \n[[model]]\nname = \"vg-{t}\"\nprovider = \"gcp\"\nupstream_model = \"gemini-{t}\"\n\
             \n[[model]]\nname = \"va-{t}\"\nprovider = \"gcp\"\nupstream_model = \"claude-{t}\"\n"
        ));
    }
    s
}

// ------------------------------------------------------- Converse fixtures

fn converse_response(tool: bool) -> Value {
    let (content, stop) = if tool {
        (
            json!([{"toolUse": {"toolUseId": "tooluse_1", "name": "get_weather", "input": {"city": "Paris"}}}]),
            "tool_use",
        )
    } else {
        (json!([{"text": "Hello world"}]), "max_tokens")
    };
    json!({"output": {"message": {"role": "assistant", "content": content}}, "stopReason": stop,
        "usage": {"inputTokens": 11, "outputTokens": 7, "totalTokens": 18}, "metrics": {"latencyMs": 1}})
}

/// CRC-32/IEEE (zlib's), bitwise: the event-stream prelude and message checksums.
fn crc32(data: &[u8]) -> u32 {
    let mut c = !0u32;
    for &b in data {
        c ^= u32::from(b);
        for _ in 0..8 {
            c = if c & 1 == 1 {
                (c >> 1) ^ 0xEDB8_8320
            } else {
                c >> 1
            };
        }
    }
    !c
}

/// One event-stream message: string headers, the payload, both CRCs.
fn frame(event: &str, payload: &Value) -> Vec<u8> {
    let mut headers = Vec::new();
    for (k, v) in [
        (":event-type", event),
        (":content-type", "application/json"),
        (":message-type", "event"),
    ] {
        headers.push(k.len() as u8);
        headers.extend_from_slice(k.as_bytes());
        headers.push(7);
        headers.extend_from_slice(&(v.len() as u16).to_be_bytes());
        headers.extend_from_slice(v.as_bytes());
    }
    let body = payload.to_string();
    let total = 12 + headers.len() + body.len() + 4;
    let mut out = Vec::with_capacity(total);
    out.extend_from_slice(&(total as u32).to_be_bytes());
    out.extend_from_slice(&(headers.len() as u32).to_be_bytes());
    let prelude = crc32(&out);
    out.extend_from_slice(&prelude.to_be_bytes());
    out.extend_from_slice(&headers);
    out.extend_from_slice(body.as_bytes());
    let msg = crc32(&out);
    out.extend_from_slice(&msg.to_be_bytes());
    out
}

fn converse_stream(tool: bool) -> Vec<u8> {
    let mut ev = vec![("messageStart", json!({"role": "assistant"}))];
    let text = |t: &str| {
        (
            "contentBlockDelta",
            json!({"delta": {"text": t}, "contentBlockIndex": 0}),
        )
    };
    let stop = |i: u64| ("contentBlockStop", json!({"contentBlockIndex": i}));
    if tool {
        ev.push(text("Checking."));
        ev.push(stop(0));
        ev.push((
            "contentBlockStart",
            json!({"start": {"toolUse": {"toolUseId": "tooluse_1",
            "name": "get_weather"}}, "contentBlockIndex": 1}),
        ));
        for a in ["{\"city\":", "\"Paris\"}"] {
            ev.push((
                "contentBlockDelta",
                json!({"delta": {"toolUse": {"input": a}}, "contentBlockIndex": 1}),
            ));
        }
        ev.push(stop(1));
        ev.push(("messageStop", json!({"stopReason": "tool_use"})));
    } else {
        ev.push(text("Hel"));
        ev.push(text("lo world"));
        ev.push(stop(0));
        ev.push(("messageStop", json!({"stopReason": "max_tokens"})));
    }
    ev.push((
        "metadata",
        json!({"usage": {"inputTokens": 11, "outputTokens": 7, "totalTokens": 18},
        "metrics": {"latencyMs": 1}}),
    ));
    ev.iter().flat_map(|(e, p)| frame(e, p)).collect()
}

// ------------------------------------------------------------ the fake

#[derive(Clone)]
struct Seen {
    path: String,
    head: String,
    body: Value,
}

fn answer(status: &str, ctype: &str, body: &[u8]) -> Vec<u8> {
    let mut out = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body);
    out
}

/// What the fake sends for `path` (404 for anything it does not know).
fn route(path: &str) -> Vec<u8> {
    let tool = path.contains("tool");
    let json_of = |v: Value| answer("200 OK", "application/json", v.to_string().as_bytes());
    let sse = |b: Vec<u8>| answer("200 OK", "text/event-stream", &b);
    if path.starts_with("/computeMetadata/v1/instance/service-accounts/default/token") {
        return json_of(json!({"access_token": TOKEN, "expires_in": 3600, "token_type": "Bearer"}));
    }
    if let Some(rest) = path.strip_prefix("/model/") {
        if rest.ends_with("/converse") {
            return json_of(converse_response(tool));
        }
        if rest.ends_with("/converse-stream") {
            return answer(
                "200 OK",
                "application/vnd.amazon.eventstream",
                &converse_stream(tool),
            );
        }
    }
    let vertex = "/v1/projects/p/locations/us-central1/publishers/";
    if let Some(rest) = path.strip_prefix(vertex) {
        if rest.ends_with(":generateContent") && rest.starts_with("google/") {
            return json_of(upstream_response(Dialect::Gemini, tool));
        }
        if rest.ends_with(":streamGenerateContent?alt=sse") && rest.starts_with("google/") {
            return sse(upstream_stream(Dialect::Gemini, tool));
        }
        if rest.ends_with(":rawPredict") && rest.starts_with("anthropic/") {
            return json_of(upstream_response(Dialect::Messages, tool));
        }
        if rest.ends_with(":streamRawPredict") && rest.starts_with("anthropic/") {
            return sse(upstream_stream(Dialect::Messages, tool));
        }
    }
    answer(
        "404 Not Found",
        "application/json",
        b"{\"message\":\"no such route\"}",
    )
}

fn fake(log: Arc<Mutex<Vec<Seen>>>) -> SocketAddr {
    common::fake_upstream(move |s, _, req| {
        use std::io::Write;
        let Some(end) = req.windows(4).position(|w| w == b"\r\n\r\n") else {
            return false;
        };
        let head = String::from_utf8_lossy(&req[..end]).into_owned();
        let path = head.split(' ').nth(1).unwrap_or_default().to_string();
        let body = serde_json::from_slice(&req[end + 4..]).unwrap_or(Value::Null);
        let out = route(&path);
        if let Ok(mut l) = log.lock() {
            l.push(Seen { path, head, body });
        }
        s.write_all(&out).is_ok()
    })
}

// ---------------------------------------------------------- the client

fn client_call(addr: SocketAddr, client: Dialect, model: &str, stream: bool) -> Option<Vec<u8>> {
    let mut body = client_request(client);
    let path = match client {
        Dialect::Chat => "/v1/chat/completions".to_string(),
        Dialect::Responses => "/v1/responses".to_string(),
        Dialect::Messages => "/v1/messages".to_string(),
        Dialect::Gemini if stream => {
            format!("/v1beta/models/{model}:streamGenerateContent?alt=sse")
        }
        Dialect::Gemini => format!("/v1beta/models/{model}:generateContent"),
    };
    if client != Dialect::Gemini {
        body["model"] = json!(model);
        if stream {
            body["stream"] = json!(true);
        }
        if stream && client == Dialect::Chat {
            body["stream_options"] = json!({"include_usage": true});
        }
    }
    let r = common::request(addr, &common::post(&path, &body.to_string()));
    (r.status == 200).then_some(r.body)
}

fn summary(addr: SocketAddr, client: Dialect, model: &str, stream: bool) -> Option<Summary> {
    let b = client_call(addr, client, model, stream)?;
    if stream {
        Some(read_stream(client, &b))
    } else {
        Some(read_body(client, &serde_json::from_slice(&b).ok()?))
    }
}

pub const FEATURES: [&str; 10] = [
    "text",
    "stream text",
    "tool call",
    "stream tool call",
    "usage",
    "stop reason",
    "system",
    "image",
    "endpoint",
    "auth",
];

/// The upstream request the text call made (the last one to a model path).
fn last_model_request(log: &Mutex<Vec<Seen>>) -> Option<Seen> {
    let l = log.lock().ok()?;
    l.iter()
        .rev()
        .find(|s| !s.path.starts_with("/computeMetadata"))
        .cloned()
}

fn request_cells(cloud: Cloud, seen: &Option<Seen>) -> [bool; 4] {
    let Some(s) = seen else {
        return [false; 4];
    };
    let r = &s.body;
    let parts = |v: &Value| v.as_array().cloned().unwrap_or_default();
    let head = s.head.to_ascii_lowercase();
    let (system, image, endpoint, auth) = match cloud {
        Cloud::Bedrock => (
            r["system"][0]["text"] == "SYS-PROMPT",
            parts(&r["messages"][0]["content"])
                .iter()
                .any(|p| p["image"] == json!({"format": "png", "source": {"bytes": "QUJD"}})),
            s.path == "/model/vendor.m-text-v1%3A0/converse",
            head.contains(&format!(
                "authorization: aws4-hmac-sha256 credential={}/",
                AKID.to_ascii_lowercase()
            )) && head.contains("/us-east-1/bedrock/aws4_request")
                && head.contains("\r\nx-amz-date: "),
        ),
        Cloud::VertexGemini => (
            has_system(Dialect::Gemini, r),
            has_image(Dialect::Gemini, r),
            s.path == "/v1/projects/p/locations/us-central1/publishers/google/models/gemini-text:generateContent",
            head.contains(&format!("authorization: bearer {TOKEN}")),
        ),
        Cloud::VertexAnthropic => (
            has_system(Dialect::Messages, r),
            has_image(Dialect::Messages, r),
            s.path == "/v1/projects/p/locations/us-central1/publishers/anthropic/models/claude-text:rawPredict"
                && r.get("model").is_none()
                && r["anthropic_version"] == "vertex-2023-10-16",
            head.contains(&format!("authorization: bearer {TOKEN}")),
        ),
    };
    [system, image, endpoint, auth]
}

/// One variant's rows: `(client, cloud, cells)`.
fn rows(v: Variant) -> Vec<(Dialect, Cloud, Vec<bool>)> {
    let log = Arc::new(Mutex::new(Vec::new()));
    let up = fake(log.clone());
    let gw = common::start_gateway(up, v, &config().replace("UP", &up.to_string()));
    let a = gw.addr;
    let mut out = Vec::new();
    for client in Dialect::ALL {
        for cloud in CLOUDS {
            let text = summary(a, client, &cloud.model(false), false);
            let seen = last_model_request(&log);
            let stext = summary(a, client, &cloud.model(false), true);
            let tool = summary(a, client, &cloud.model(true), false);
            let stool = summary(a, client, &cloud.model(true), true);
            let mut cells = vec![
                text.as_ref().is_some_and(|s| s.text == "Hello world"),
                stext.as_ref().is_some_and(|s| s.text == "Hello world"),
                tool.as_ref().is_some_and(|s| tool_ok(client, s, false)),
                stool
                    .as_ref()
                    .is_some_and(|s| s.text == "Checking." && tool_ok(client, s, true)),
                [&text, &stext, &stool]
                    .iter()
                    .all(|s| s.as_ref().is_some_and(|s| s.usage == (11, 7))),
                [&text, &stext]
                    .iter()
                    .all(|s| s.as_ref().is_some_and(|s| s.stop == "length")),
            ];
            cells.extend(request_cells(cloud, &seen));
            out.push((client, cloud, cells));
        }
    }
    gw.stop();
    out
}

/// The section, from the first variant; every other variant must give the same cells.
pub fn section() -> (String, usize) {
    // The chain's first source: the environment (set before any gateway starts; nothing
    // else in this test binary reads it). Vertex: the metadata server (the fake).
    std::env::set_var("AWS_ACCESS_KEY_ID", AKID);
    std::env::set_var("AWS_SECRET_ACCESS_KEY", "conformance-secret");
    std::env::remove_var("AWS_SESSION_TOKEN");
    std::env::remove_var("AWS_BEARER_TOKEN_BEDROCK");
    std::env::remove_var("GOOGLE_APPLICATION_CREDENTIALS");
    let mut variants = common::variants();
    let Some(first) = variants.next() else {
        return (String::new(), 1);
    };
    let log = Arc::new(Mutex::new(Vec::new()));
    let meta = fake(log);
    std::env::set_var("GCE_METADATA_HOST", meta.to_string());
    let base = rows(first);
    let mut failures = 0;
    for v in variants {
        let other = rows(v);
        let same = other.iter().map(|r| &r.2).eq(base.iter().map(|r| &r.2));
        assert!(same, "cloud rows differ under {v:?}");
    }
    let mut md = String::from(
        "\n## Cloud providers: Bedrock and Vertex through the gateway\n\n\
         Each cell is a request through a running gateway (every driver and shard count of\n\
         `common::variants()`, which must agree) to a fake upstream on loopback\n\
         (`tests/dialect/conformance/cloud.rs`): Bedrock Converse answers as JSON and\n\
         ConverseStream as AWS event-stream frames with valid CRCs; Vertex with a metadata-server\n\
         token, Gemini models at `:generateContent` / `:streamGenerateContent?alt=sse`, Anthropic\n\
         models at `:rawPredict` / `:streamRawPredict`. The answers are the fixtures above (Converse\n\
         ones from the Bedrock API reference); the columns are the ones above, plus:\n\n\
         * system / image: what the upstream received (Converse `system[]`, `image.source.bytes`)\n\
         * endpoint: the upstream path (the Bedrock model id `:` sent as `%3A`; Vertex project,\n  \
           location and publisher), and for Anthropic on Vertex a body without `model` and with\n  \
           `anthropic_version = \"vertex-2023-10-16\"`\n\
         * auth: Bedrock a SigV4 `Authorization` (key id, `us-east-1/bedrock` scope, `x-amz-date`;\n  \
           botocore recomputes the signatures in `tests/sdk/test_bedrock.py`), Vertex the token\n  \
           from the metadata server as `Bearer`\n\n",
    );
    md.push_str("| client ← upstream |");
    for f in FEATURES {
        md.push_str(&format!(" {f} |"));
    }
    md.push_str("\n|---|");
    for _ in FEATURES {
        md.push_str("---|");
    }
    md.push('\n');
    for (client, cloud, cells) in &base {
        md.push_str(&format!("| {} ← {} |", name(*client), cloud.label()));
        for ok in cells {
            failures += usize::from(!ok);
            md.push_str(if *ok { " pass |" } else { " FAIL |" });
        }
        md.push('\n');
    }
    (md, failures)
}
