//! Doctor: every provider with an `engine` — its load signal, fetched and read the way the
//! poller will (`engine::target_of`, `engine::signal::normalise`), and the model names the
//! gateway sends compared with what the engine lists at `GET {base}/models`.
//!
//! - a signal URL answering 501 or 404 is a problem naming the flag the engine needs
//!   (llama.cpp: `--metrics` for `/metrics`, `--slots` for `/slots`; others: their metrics
//!   switch); such an engine is still routed by the gateway's own in-flight count, but blind;
//! - a page that does not read as the engine's signal is a problem (wrong `engine` or URL);
//! - a model name the gateway sends that the engine does not list is a warning: llama.cpp
//!   answers every name with its own (the GGUF path unless started with `--alias NAME`), vLLM
//!   refuses it unless `--served-model-name NAME`.
//!
//! Owns: those probes. Must not: send anything but GETs, or print a response body beyond the
//! model ids the engine lists. Plain HTTP only (an `https` signal URL is said and skipped).

use std::io::Write;
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use super::Report;
use crate::config::endpoint::Endpoint;
use crate::config::{Config, ProviderConfig};
use crate::engine::signal::{normalise, EngineKind};

const STEP: Duration = Duration::from_secs(3);

pub fn check(r: &mut Report, cfg: &Config) {
    let engines: Vec<&ProviderConfig> = cfg
        .providers
        .iter()
        .filter(|p| p.engine.is_some())
        .collect();
    if engines.is_empty() {
        return;
    }
    r.section("engines");
    for p in engines {
        one(r, cfg, p);
    }
}

/// The flag an engine of `kind` needs for the signal at `path`.
pub fn flag_for(kind: EngineKind, path: &str) -> &'static str {
    match kind {
        EngineKind::Llamacpp if path.ends_with("/slots") => "start llama-server with `--slots` (or drop `--no-slots`)",
        EngineKind::Llamacpp => "start llama-server with `--metrics`, or leave metrics_url unset (`/slots`, on by default)",
        EngineKind::Vllm => "vLLM serves /metrics unless disabled: check metrics_url and the port",
        EngineKind::Sglang => "start SGLang with `--enable-metrics`",
        EngineKind::Tgi => "TGI serves /metrics on its port: check metrics_url",
        EngineKind::Ollama => "Ollama has no load signal: leave metrics_url unset",
    }
}

fn one(r: &mut Report, cfg: &Config, p: &ProviderConfig) {
    let name = p.name.get_ref();
    let Some((kind, url, _, _)) = crate::engine::target_of(p) else {
        return;
    };
    match url {
        None => r.ok(format!(
            "{name} ({}): no load signal to poll; routed by the gateway's own in-flight count",
            kind.as_str()
        )),
        Some(url) => signal(r, name, kind, &url),
    }
    models(r, cfg, p, kind);
}

fn signal(r: &mut Report, name: &str, kind: EngineKind, url: &str) {
    let Ok(ep) = Endpoint::parse(url) else {
        r.problem(
            format!("{name}: metrics_url {url} does not parse"),
            "ringgate check --config FILE",
        );
        return;
    };
    if ep.tls {
        r.info(format!("{name}: load signal {url}: https, not probed"));
        return;
    }
    let path = if ep.base_path.is_empty() {
        "/".to_string()
    } else {
        ep.base_path.clone()
    };
    match get(&ep, &path) {
        Err(e) => r.problem(
            format!("{name}: load signal GET {url}: {e}"),
            "is the engine up, and metrics_url its host and port?",
        ),
        Ok((status @ (501 | 404), _)) => r.problem(
            format!(
                "{name}: load signal GET {url} → {status}: the engine does not serve it, so \
                 lb = \"load\" routes to it blind (by the gateway's own in-flight count)"
            ),
            flag_for(kind, &path),
        ),
        Ok((200, body)) => match normalise(kind, &body, path.ends_with("/slots")) {
            Ok(s) if s.slots > 0 => r.ok(format!(
                "{name}: load signal {url}: {} of {} slot(s) busy (no queue on /slots: the \
                 gateway counts its own requests there)",
                s.running, s.slots
            )),
            Ok(s) => r.ok(format!(
                "{name}: load signal {url}: {} waiting, {} running{}",
                s.waiting,
                s.running,
                s.kv.map(|k| format!(", KV {:.0} %", k * 100.0))
                    .unwrap_or_default()
            )),
            Err(e) => r.problem(
                format!(
                    "{name}: load signal {url} does not read as {}: {e}",
                    kind.as_str()
                ),
                "check `engine` and metrics_url",
            ),
        },
        Ok((503, _)) => r.warn(
            format!("{name}: load signal GET {url} → 503 (the engine is loading or busy)"),
            "run doctor again once the engine's /health is 200",
        ),
        Ok((status, _)) => r.problem(
            format!("{name}: load signal GET {url} → {status}"),
            "check metrics_url",
        ),
    }
}

/// The model names the gateway sends to provider `p`.
fn sent_names<'a>(cfg: &'a Config, p: &ProviderConfig) -> Vec<&'a str> {
    let mut out: Vec<&str> = Vec::new();
    for m in &cfg.models {
        for d in m.deployment_refs() {
            if d.provider.get_ref() != p.name.get_ref() {
                continue;
            }
            let n = d
                .upstream_model
                .or(m.upstream_model.as_deref())
                .unwrap_or(m.name.get_ref());
            if !out.contains(&n) {
                out.push(n);
            }
        }
    }
    out
}

fn models(r: &mut Report, cfg: &Config, p: &ProviderConfig, kind: EngineKind) {
    let name = p.name.get_ref();
    let Some(base) = p.base_url.as_ref() else {
        return;
    };
    let Ok(ep) = Endpoint::parse(base.get_ref()) else {
        return;
    };
    if ep.tls {
        return;
    }
    let path = format!("{}/models", ep.base_path);
    let listed: Vec<String> = match get(&ep, &path) {
        Ok((200, body)) => model_ids(&body),
        // the provider section already reports what is wrong with reaching it
        _ => return,
    };
    let sent = sent_names(cfg, p);
    let missing: Vec<&str> = sent
        .iter()
        .copied()
        .filter(|n| !listed.iter().any(|l| l == n))
        .collect();
    if missing.is_empty() {
        if !sent.is_empty() {
            r.ok(format!("{name}: serves {}", sent.join(", ")));
        }
        return;
    }
    let fix = match kind {
        EngineKind::Llamacpp => format!(
            "start llama-server with `--alias {}` (it answers any name with its own), or set \
             upstream_model to what it lists",
            missing[0]
        ),
        EngineKind::Vllm => format!("start vLLM with `--served-model-name {}`", missing[0]),
        _ => "set upstream_model to a name the engine lists".into(),
    };
    r.warn(
        format!(
            "{name}: the gateway sends model {} but the engine lists {}",
            missing.join(", "),
            if listed.is_empty() {
                "none".to_string()
            } else {
                listed.join(", ")
            }
        ),
        fix,
    );
}

/// The `id`s of an OpenAI-style models list (bounded: at most 64, each at most 256 bytes).
fn model_ids(body: &[u8]) -> Vec<String> {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) else {
        return Vec::new();
    };
    let list = v
        .get("data")
        .or_else(|| v.get("models"))
        .and_then(|d| d.as_array());
    list.map(|a| {
        a.iter()
            .take(64)
            .filter_map(|m| m.get("id").or_else(|| m.get("name"))?.as_str())
            .filter(|s| s.len() <= 256)
            .map(str::to_string)
            .collect()
    })
    .unwrap_or_default()
}

/// `GET path` (Connection: close): status and body (length-framed, chunked or to close).
fn get(ep: &Endpoint, path: &str) -> Result<(u16, Vec<u8>), String> {
    let addr = (ep.host.as_str(), ep.port)
        .to_socket_addrs()
        .map_err(|e| e.to_string())?
        .next()
        .ok_or("no address")?;
    let mut s = TcpStream::connect_timeout(&addr, STEP).map_err(|e| e.to_string())?;
    let _ = s.set_read_timeout(Some(STEP));
    let _ = s.set_write_timeout(Some(STEP));
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {}\r\nAccept: application/json, text/plain\r\nUser-Agent: ringgate-doctor\r\nConnection: close\r\n\r\n",
        ep.host_header
    )
    .map_err(|e| format!("write: {e}"))?;
    super::provider::read_response(&mut s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_and_model_ids() {
        assert!(flag_for(EngineKind::Llamacpp, "/metrics").contains("--metrics"));
        assert!(flag_for(EngineKind::Llamacpp, "/slots").contains("--slots"));
        let ids = model_ids(
            br#"{"object":"list","data":[{"id":"/models/SmolLM2.gguf","object":"model"}]}"#,
        );
        assert_eq!(ids, vec!["/models/SmolLM2.gguf".to_string()]);
        assert!(model_ids(b"not json").is_empty());
        // pages recorded from a real llama-server (tests/fixtures/engines/llamacpp/)
        let alias = include_bytes!("../../../tests/fixtures/engines/llamacpp/models.json");
        assert_eq!(model_ids(alias), vec!["smollm2".to_string()]);
        let bare = include_bytes!("../../../tests/fixtures/engines/llamacpp/models-no-alias.json");
        assert_eq!(
            model_ids(bare),
            vec!["SmolLM2-135M-Instruct.Q4_1.gguf".to_string()]
        );
    }
}
