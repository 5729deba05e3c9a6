//! The simulated engines' own load signals, in each engine's real names and formats:
//! - vLLM `GET /metrics` (V1 engine): `vllm:num_requests_running`, `vllm:num_requests_waiting`,
//!   `vllm:kv_cache_usage_perc` (0..1) with `engine` and `model_name` labels, float values,
//!   plus the prompt/generation/prefix-cache counters;
//! - SGLang `GET /metrics`: `sglang:num_running_reqs`, `sglang:num_queue_reqs`,
//!   `sglang:token_usage` (0..1), `sglang:cache_hit_rate` with a `model_name` label;
//! - llama.cpp `llama-server`: `GET /metrics` only with `--metrics` (else its 501), its ten
//!   counters and five gauges as it prints them; `GET /slots` (501 with `--no-slots`): one
//!   object per slot, with its current or last task's fields once it has served one;
//!   `GET /v1/models`, `GET /props`, `GET /health`, and its 503 while the model loads.
//!
//! vLLM's and SGLang's shapes follow the engines' documented examples (SGLang's
//! production_metrics page, vLLM's metrics design doc). llama.cpp's follow pages recorded from
//! a real llama-server (tests/fixtures/engines/llamacpp/): key for key, value types, metric
//! families, help texts and error bodies, checked by
//! `the_llamacpp_simulator_serves_pages_shaped_like_the_real_engines` (tests/route/engines.rs).
//!
//! Owns: `page` (which engine page a GET is), `metrics`, `slots`. Must not: hold state (it
//! renders an `engine::Load`; `Engine::scrape` restarts llama.cpp's buckets).

use std::fmt::Write;

use super::engine::{Engine, EngineKind, EngineSpec, Load, LOADING};

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
        EngineKind::Llamacpp => llama_metrics(&mut o, l),
    }
    o
}

/// llama.cpp's `/metrics` (`server_task_result_metrics::to_metrics`): its ten counters, then
/// its five gauges, unlabelled, values as C++ streams print doubles (`%g`: six significant
/// digits, `1.23457e+06`). The two throughput gauges are rates over the bucket since the last
/// `GET /metrics` (`Engine::scrape` resets it): decode steps (the first token comes with the
/// prompt) per second of their time.
fn llama_metrics(o: &mut String, l: &Load) {
    let s = &l.llama;
    let rate = |b: super::engine::Spent| {
        if b.us == 0 {
            0.0
        } else {
            b.n as f64 / b.us as f64 * 1e6
        }
    };
    let counters: [(&str, &str, f64); 10] = [
        (
            "prompt_tokens_total",
            "Number of prompt tokens processed, excluding cached tokens",
            s.prompt.n as f64,
        ),
        (
            "prompt_tokens_cached_total",
            "Number of prompt tokens reused from the cache",
            s.prompt_cached as f64,
        ),
        (
            "prompt_seconds_total",
            "Total time spent processing prompts",
            s.prompt.us as f64 / 1e6,
        ),
        (
            "tokens_predicted_total",
            "Number of generation tokens processed",
            s.predicted as f64,
        ),
        (
            "tokens_predicted_seconds_total",
            "Total time spent generating tokens",
            s.predict.us as f64 / 1e6,
        ),
        (
            "n_decode_total",
            "Total number of llama_decode() calls, excluding speculative decoding and multimodal decoding",
            s.decodes as f64,
        ),
        (
            "n_tokens_max",
            "Largest observed sequence length (prompt + generation)",
            s.tokens_max as f64,
        ),
        (
            "spec_decode_num_draft_tokens_total",
            "Speculative: Total draft tokens generated",
            0.0,
        ),
        (
            "spec_decode_num_accepted_tokens_total",
            "Speculative: Total draft tokens accepted by the target model",
            0.0,
        ),
        (
            "spec_decode_num_drafts_total",
            "Speculative: Total speculative decoding verification steps",
            0.0,
        ),
    ];
    let gauges: [(&str, &str, f64); 5] = [
        (
            "prompt_tokens_seconds",
            "Average prompt throughput in tokens/s",
            rate(s.bucket_prompt),
        ),
        (
            "predicted_tokens_seconds",
            "Average generation throughput in tokens/s",
            rate(s.bucket_predict),
        ),
        (
            "requests_processing",
            "Number of requests processing",
            f64::from(l.running),
        ),
        (
            "requests_deferred",
            "Number of requests deferred",
            f64::from(l.waiting),
        ),
        (
            "n_busy_slots_per_decode",
            "Average number of busy slots per llama_decode() call",
            s.busy_in_decodes as f64 / (s.decodes as f64).max(1.0),
        ),
    ];
    for (kind, items) in [("counter", &counters[..]), ("gauge", &gauges[..])] {
        for (name, help, v) in items {
            let _ = writeln!(o, "# HELP llamacpp:{name} {help}");
            let _ = writeln!(o, "# TYPE llamacpp:{name} {kind}");
            let _ = writeln!(o, "llamacpp:{name} {}", cpp_g(*v));
        }
    }
}

/// `v` as a C++ `std::ostream` prints a double by default (`%g`, precision 6).
fn cpp_g(v: f64) -> String {
    if v == 0.0 || !v.is_finite() {
        return if v.is_finite() {
            "0".into()
        } else {
            v.to_string()
        };
    }
    let sci = format!("{v:.5e}");
    let (mant, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let trim = |t: &str| -> String {
        if t.contains('.') {
            t.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            t.to_string()
        }
    };
    if !(-4..6).contains(&exp) {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{}e{sign}{:02}", trim(mant), exp.abs())
    } else {
        trim(&format!("{v:.*}", (5 - exp) as usize))
    }
}

/// llama.cpp's `GET /slots` (`server_slot::to_json` with `only_metrics`, keys in its order):
/// every slot has `id`, `n_ctx`, `speculative`, `is_processing`; one that has served a task
/// also its current or last task's `id_task`, `n_prompt_tokens`, `n_prompt_tokens_processed`,
/// `n_prompt_tokens_cache`, `params` and `next_token` (an array of one object). Once the task
/// is done the slot keeps its prompt size and params, its counters reset (processed and cached
/// 0, `has_next_token` true, `n_remain` -1, nothing decoded), as llama-server's do.
pub fn slots(spec: &EngineSpec, l: &Load) -> String {
    let mut o = String::from("[");
    let ctx = n_ctx(spec);
    for (i, busy) in l.busy.iter().enumerate() {
        if i > 0 {
            o.push(',');
        }
        let _ = write!(
            o,
            r#"{{"id":{i},"n_ctx":{ctx},"speculative":false,"is_processing":{busy}"#
        );
        if let Some(Some(t)) = l.tasks.get(i) {
            let (processed, cached, decoded, remain) = if t.done {
                (0, 0, 0, -1)
            } else {
                let remain = t.n_predict.saturating_sub(t.n_decoded);
                (
                    t.n_prompt_tokens_processed,
                    t.n_prompt_tokens_cache,
                    t.n_decoded,
                    i64::try_from(remain).unwrap_or(i64::MAX),
                )
            };
            let _ = write!(
                o,
                r#","id_task":{},"n_prompt_tokens":{},"n_prompt_tokens_processed":{processed},"n_prompt_tokens_cache":{cached},"params":{},"next_token":[{{"has_next_token":true,"has_new_line":false,"n_remain":{remain},"n_decoded":{decoded}}}]"#,
                t.id_task,
                t.n_prompt_tokens,
                params(
                    &t.n_predict.to_string(),
                    t.stream,
                    r#""chat_format":"peg-native","reasoning_format":"deepseek","reasoning_in_content":false,"generation_prompt":"<|im_start|>assistant\n""#
                ),
            );
        }
        o.push('}');
    }
    o.push(']');
    o
}

/// A slot's context (`-c` / `-np`).
fn n_ctx(spec: &EngineSpec) -> u64 {
    spec.kv_tokens / u64::from(spec.slots.max(1))
}

/// `task_params::to_json(true)`: llama-server's sampling defaults (the mock does not sample),
/// `max_tokens` / `n_predict`, `stream` and the chat-format fields `chat` (the served chat
/// template's, for a chat task; the defaults' in `/props`).
fn params(n_predict: &str, stream: bool, chat: &str) -> String {
    format!(
        r#"{{"seed":4294967295,"temperature":0.800000011920929,"dynatemp_range":0.0,"dynatemp_exponent":1.0,"top_k":40,"top_p":0.949999988079071,"min_p":0.05000000074505806,"top_n_sigma":-1.0,"xtc_probability":0.0,"xtc_threshold":0.10000000149011612,"typical_p":1.0,"repeat_last_n":64,"repeat_penalty":1.0,"presence_penalty":0.0,"frequency_penalty":0.0,"dry_multiplier":0.0,"dry_base":1.75,"dry_allowed_length":2,"dry_penalty_last_n":64,"mirostat":0,"mirostat_tau":5.0,"mirostat_eta":0.10000000149011612,"adaptive_target":-1.0,"adaptive_decay":0.8999999761581421,"max_tokens":{n_predict},"n_predict":{n_predict},"n_keep":0,"n_discard":0,"ignore_eos":false,"stream":{stream},"n_probs":0,"min_keep":0,{chat},"samplers":["penalties","dry","top_n_sigma","top_k","typ_p","top_p","min_p","xtc","temperature"],"speculative.types":"none","timings_per_token":false,"post_sampling_probs":false,"backend_sampling":false,"lora":[]}}"#
    )
}

fn json_str(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

/// llama.cpp's `GET /v1/models`: its Ollama-style `models` list, then the OpenAI-style `data`
/// (the served name as `id` and its only alias; `meta` as SmolLM2-135M's).
fn models(spec: &EngineSpec) -> String {
    let m = json_str(&spec.model_name);
    format!(
        r#"{{"models":[{{"name":{m},"model":{m},"modified_at":"","size":"","digest":"","type":"model","description":"","tags":[""],"capabilities":["completion"],"parameters":"","details":{{"parent_model":"","format":"gguf","family":"","families":[""],"parameter_size":"","quantization_level":""}}}}],"object":"list","data":[{{"id":{m},"aliases":[{m}],"tags":[],"object":"model","created":{},"owned_by":"llamacpp","meta":{{"vocab_type":2,"n_vocab":49152,"n_ctx":{},"n_ctx_train":8192,"n_embd":576,"n_params":134515008,"size":96576768,"ftype":"Q4_1"}}}}]}}"#,
        super::chat::CREATED,
        n_ctx(spec)
    )
}

/// llama.cpp's `GET /props` (`get_props`): default generation settings, slots, the model, the
/// endpoints switched on, the chat template (SmolLM2's) and the build.
fn props(spec: &EngineSpec) -> String {
    let m = json_str(&spec.model_name);
    let template = json_str(
        "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}",
    );
    format!(
        r#"{{"default_generation_settings":{{"params":{},"n_ctx":{}}},"total_slots":{},"model_alias":{m},"model_ftype":"Q4_1","model_path":{m},"modalities":{{"vision":false,"video":false,"audio":false}},"media_marker":"<__media_mock__>","endpoint_slots":{},"endpoint_props":false,"endpoint_metrics":{},"ui":true,"ui_settings":{{}},"chat_template":{template},"chat_template_caps":{{"supports_object_arguments":false,"supports_parallel_tool_calls":false,"supports_preserve_reasoning":false,"supports_reasoning_effort":false,"supports_string_content":true,"supports_system_role":true,"supports_tool_calls":false,"supports_tools":false,"supports_typed_content":false}},"bos_token":"<|im_start|>","eos_token":"<|im_end|>","build_info":"mock","is_sleeping":false,"cors_proxy_enabled":false}}"#,
        params(
            "-1",
            false,
            r#""chat_format":"Content-only","reasoning_format":"none","reasoning_in_content":false,"generation_prompt":"""#
        ),
        n_ctx(spec),
        spec.slots,
        spec.slots_page,
        spec.metrics,
    )
}

/// The JSON error llama-server answers in its dialect (`format_error_response`).
fn llama_error(code: u16, message: &str, kind: &str) -> String {
    format!(r#"{{"error":{{"code":{code},"message":"{message}","type":"{kind}"}}}}"#)
}

/// A simulated engine's own pages: `GET /metrics` (llama.cpp: only with `spec.metrics`, as
/// `--metrics`; else its 501), `GET /health`; llama.cpp's `GET /slots` (501 without
/// `spec.slots_page`), `GET /v1/models`, `GET /props`, and its 503 for all of them while the
/// model loads; `None` for every other path (the mock's usual routes answer it).
pub fn page(e: &Engine, path: &[u8]) -> Option<(u16, &'static [u8], String)> {
    let text: &'static [u8] = b"text/plain; version=0.0.4";
    let json: &'static [u8] = b"application/json; charset=utf-8";
    let llama = e.spec.kind == EngineKind::Llamacpp;
    let ours = matches!(path, b"/metrics" | b"/health")
        || (llama && matches!(path, b"/slots" | b"/v1/models" | b"/props"));
    if !ours {
        return None;
    }
    if llama && e.loading() {
        return Some((503, json, LOADING.into()));
    }
    let unsupported = |what: &str, flag: &str| {
        let msg = format!("This server does not support {what} endpoint. Start it with `{flag}`");
        Some((501, json, llama_error(501, &msg, "not_supported_error")))
    };
    match path {
        b"/metrics" if llama && !e.spec.metrics => unsupported("metrics", "--metrics"),
        b"/metrics" => Some((200, text, metrics(&e.spec, &e.scrape()))),
        b"/slots" if !e.spec.slots_page => unsupported("slots", "--slots"),
        b"/slots" => Some((200, json, slots(&e.spec, &e.load()))),
        b"/v1/models" => Some((200, json, models(&e.spec))),
        b"/props" => Some((200, json, props(&e.spec))),
        _ => Some((200, json, r#"{"status":"ok"}"#.into())),
    }
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
            tasks: vec![None; 4],
            llama: Default::default(),
        }
    }

    #[test]
    fn cpp_doubles() {
        for (v, want) in [
            (0.0, "0"),
            (3.0, "3"),
            (33065.0, "33065"),
            (999_999.0, "999999"),
            (1_234_567.0, "1.23457e+06"),
            (235.7431, "235.743"),
            (0.125, "0.125"),
            (1.0 / 3.0, "0.333333"),
            (0.000_012_5, "1.25e-05"),
            (2.5e7, "2.5e+07"),
        ] {
            assert_eq!(cpp_g(v), want, "{v}");
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
