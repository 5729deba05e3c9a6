//! The simulated engines' own load signals, in each engine's real names and formats:
//! - vLLM `GET /metrics` (V1 engine): `vllm:num_requests_running`, `vllm:num_requests_waiting`,
//!   `vllm:kv_cache_usage_perc` (0..1) with `engine` and `model_name` labels, float values,
//!   plus the prompt/generation/prefix-cache counters;
//! - SGLang `GET /metrics`: `sglang:num_running_reqs`, `sglang:num_queue_reqs`,
//!   `sglang:token_usage` (0..1), `sglang:cache_hit_rate` with a `model_name` label;
//! - llama.cpp `llama-server --metrics` `GET /metrics`: `llamacpp:requests_processing`,
//!   `llamacpp:requests_deferred` (no labels, integers) and the token counters; `GET /slots`:
//!   one JSON object per slot with `id`, `id_task`, `n_ctx`, `speculative`, `is_processing`.
//!
//! The shapes follow the engines' documented examples (SGLang's production_metrics page,
//! llama.cpp's server README and metrics code, vLLM's metrics design doc); the recorded sample
//! pages under tests/fixtures/engines/ are what the poller's tests parse.
//!
//! Owns: `metrics`, `slots`. Must not: hold state (it renders an `engine::Load`).

use std::fmt::Write;

use super::engine::{EngineKind, EngineSpec, Load};

fn gauge(out: &mut String, name: &str, help: &str, labels: &str, v: f64, kind: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
    if labels.is_empty() {
        let _ = writeln!(out, "{name} {v}");
    } else {
        let _ = writeln!(out, "{name}{{{labels}}} {v:?}");
    }
}

/// The engine's `GET /metrics` page (Prometheus text format 0.0.4).
pub fn metrics(spec: &EngineSpec, l: &Load) -> String {
    let mut o = String::with_capacity(2048);
    let m = &spec.model_name;
    match spec.kind {
        EngineKind::Vllm => {
            let lb = format!("engine=\"0\",model_name=\"{m}\"");
            let g = |o: &mut String, n, h, v, k| gauge(o, n, h, &lb, v, k);
            g(
                &mut o,
                "vllm:num_requests_running",
                "Number of requests in model execution batches.",
                f64::from(l.running),
                "gauge",
            );
            g(
                &mut o,
                "vllm:num_requests_waiting",
                "Number of requests waiting to be processed.",
                f64::from(l.waiting),
                "gauge",
            );
            g(
                &mut o,
                "vllm:kv_cache_usage_perc",
                "KV-cache usage. 1 means 100 percent usage.",
                l.kv_usage,
                "gauge",
            );
            g(
                &mut o,
                "vllm:prefix_cache_queries_total",
                "Prefix cache queries, in terms of number of queried tokens.",
                l.cache_queries as f64,
                "counter",
            );
            g(
                &mut o,
                "vllm:prefix_cache_hits_total",
                "Prefix cache hits, in terms of number of cached tokens.",
                l.cache_hits as f64,
                "counter",
            );
            g(
                &mut o,
                "vllm:prompt_tokens_total",
                "Number of prefill tokens processed.",
                l.prompt_tokens as f64,
                "counter",
            );
            g(
                &mut o,
                "vllm:generation_tokens_total",
                "Number of generation tokens processed.",
                l.generation_tokens as f64,
                "counter",
            );
        }
        EngineKind::Sglang => {
            let lb = format!("model_name=\"{m}\"");
            let g = |o: &mut String, n, h, v, k| gauge(o, n, h, &lb, v, k);
            g(
                &mut o,
                "sglang:prompt_tokens_total",
                "Number of prefill tokens processed.",
                l.prompt_tokens as f64,
                "counter",
            );
            g(
                &mut o,
                "sglang:generation_tokens_total",
                "Number of generation tokens processed.",
                l.generation_tokens as f64,
                "counter",
            );
            g(
                &mut o,
                "sglang:num_running_reqs",
                "The number of running requests.",
                f64::from(l.running),
                "gauge",
            );
            g(
                &mut o,
                "sglang:num_queue_reqs",
                "The number of requests in the waiting queue.",
                f64::from(l.waiting),
                "gauge",
            );
            g(
                &mut o,
                "sglang:token_usage",
                "The token usage.",
                l.kv_usage,
                "gauge",
            );
            let rate = if l.cache_queries == 0 {
                0.0
            } else {
                l.cache_hits as f64 / l.cache_queries as f64
            };
            g(
                &mut o,
                "sglang:cache_hit_rate",
                "The prefix cache hit rate.",
                rate,
                "gauge",
            );
        }
        EngineKind::Llamacpp => {
            let g = |o: &mut String, n, h, v: u64, k| gauge(o, n, h, "", v as f64, k);
            g(
                &mut o,
                "llamacpp:prompt_tokens_total",
                "Number of prompt tokens processed.",
                l.prompt_tokens,
                "counter",
            );
            g(
                &mut o,
                "llamacpp:tokens_predicted_total",
                "Number of generation tokens processed.",
                l.generation_tokens,
                "counter",
            );
            g(
                &mut o,
                "llamacpp:requests_processing",
                "Number of requests processing.",
                u64::from(l.running),
                "gauge",
            );
            g(
                &mut o,
                "llamacpp:requests_deferred",
                "Number of requests deferred.",
                u64::from(l.waiting),
                "gauge",
            );
        }
    }
    o
}

/// llama.cpp's `GET /slots` (an array, one object per slot).
pub fn slots(spec: &EngineSpec, l: &Load) -> String {
    let mut o = String::from("[");
    let ctx = spec.kv_tokens / u64::from(spec.slots.max(1));
    for (i, busy) in l.busy.iter().enumerate() {
        if i > 0 {
            o.push(',');
        }
        let task = if *busy { i as i64 + 1 } else { -1 };
        let _ = write!(
            o,
            r#"{{"id":{i},"id_task":{task},"n_ctx":{ctx},"speculative":false,"is_processing":{busy},"params":{{"n_predict":-1,"temperature":0.8}}}}"#
        );
    }
    o.push(']');
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load() -> Load {
        Load {
            running: 3,
            waiting: 2,
            kv_usage: 0.25,
            busy: vec![true, true, true, false],
            prompt_tokens: 10,
            generation_tokens: 20,
            requests: 1,
            cache_queries: 10,
            cache_hits: 5,
        }
    }

    #[test]
    fn pages_carry_the_real_series() {
        let v = metrics(&EngineSpec::new(EngineKind::Vllm, 4), &load());
        assert!(
            v.contains("vllm:num_requests_waiting{engine=\"0\",model_name=\"mock\"} 2.0\n"),
            "{v}"
        );
        assert!(v.contains("vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"mock\"} 0.25\n"));
        let s = metrics(&EngineSpec::new(EngineKind::Sglang, 4), &load());
        assert!(
            s.contains("sglang:num_queue_reqs{model_name=\"mock\"} 2.0\n"),
            "{s}"
        );
        let c = metrics(&EngineSpec::new(EngineKind::Llamacpp, 4), &load());
        assert!(c.contains("\nllamacpp:requests_deferred 2\n"), "{c}");
        let j = slots(&EngineSpec::new(EngineKind::Llamacpp, 4), &load());
        let v: serde_json::Value = serde_json::from_str(&j).unwrap();
        assert_eq!(v.as_array().unwrap().len(), 4);
        assert_eq!(v[3]["is_processing"], false);
        assert_eq!(v[0]["is_processing"], true);
    }
}
