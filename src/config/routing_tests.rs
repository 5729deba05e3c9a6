use std::time::Duration;

use super::*;
use crate::config::policy::{Lb, Reason, RetrySet};

/// The issue's config contract, verbatim (issue 9, section 3).
const CONTRACT: &str = r#"
[[provider]]
name = "a"
kind = "openai"
base_url = "http://127.0.0.1:9001/v1"
api_key_env = "A_KEY"

[[provider]]
name = "a2"
kind = "openai-compatible"
base_url = "http://127.0.0.1:9003/v1"

[[provider]]
name = "b"
kind = "anthropic"
base_url = "http://127.0.0.1:9002"
api_key_env = "B_KEY"

[[model]]
name = "gpt-4o-mini"
deployments = [
  { provider = "a", upstream_model = "gpt-4o-mini", weight = 3 },
  { provider = "a2", upstream_model = "gpt-4o-mini", weight = 1 },
]
lb = "p2c"                     # "p2c" | "weighted"
fallbacks = ["claude-haiku"]   # model names, tried in order after every deployment failed
max_attempts = 3               # total upstream attempts for one client request
breaker = { failures = 5, cooldown_ms = 10000 }

[[model]]
name = "claude-haiku"
provider = "b"                 # the one-deployment shorthand stays valid
upstream_model = "claude-3-5-haiku-latest"
"#;

const PROVIDERS: &str =
    "[[provider]]\nname = \"a\"\nkind = \"mock\"\n\n[[provider]]\nname = \"b\"\nkind = \"mock\"\n";

/// Parse `PROVIDERS` (lines 1–7) + `models`; the errors as (line, message).
fn errors(models: &str) -> Vec<(Option<usize>, String)> {
    match Config::parse(&format!("{PROVIDERS}{models}")) {
        Ok(_) => Vec::new(),
        Err(e) => e.into_iter().map(|e| (e.line, e.message)).collect(),
    }
}

#[test]
fn contract_parses_with_its_policy() {
    let c = Config::parse(CONTRACT).unwrap();
    let m = &c.models[0];
    let ds = m.deployment_refs();
    assert_eq!(ds.len(), 2);
    assert_eq!(ds[0].provider.get_ref(), "a");
    assert_eq!((ds[0].weight, ds[1].weight), (3, 1));
    let p = c.policy(m);
    assert_eq!(p.lb, Lb::P2c);
    assert_eq!(p.max_attempts, 3);
    assert_eq!(p.breaker.failures, 5);
    assert_eq!(p.breaker.cooldown, Duration::from_secs(10));
    assert_eq!(p.retry_on, RetrySet::all());
    assert_eq!(
        p.deadline,
        Duration::from_millis(c.upstream.total_timeout_ms)
    );
    assert_eq!(c.find_model("claude-haiku"), Some(1));
    let haiku = c.models[1].deployment_refs();
    assert_eq!(haiku[0].upstream_model, Some("claude-3-5-haiku-latest"));
    assert_eq!(c.models[1].first_provider(), Some("b"));
}

#[test]
fn example_files_pass_check() {
    for f in ["examples/contract.toml", "examples/routing.toml"] {
        let path = format!("{}/{f}", env!("CARGO_MANIFEST_DIR"));
        if let Err(e) = Config::load(&path) {
            panic!("{f}: {e:?}");
        }
    }
}

#[test]
fn routing_defaults_are_overridden_per_model_field_by_field() {
    let c = Config::parse(&format!(
        "{PROVIDERS}\n[routing]\nlb = \"weighted\"\nmax_attempts = 4\nretry_on = [\"connect\", \"503\"]\n\
         breaker = {{ failures = 2, cooldown_ms = 500, error_rate = 0.5 }}\ntimeout_ms = 9000\n\
         first_byte_timeout_ms = 700\n\
         [[model]]\nname = \"x\"\nprovider = \"a\"\n\
         [[model]]\nname = \"y\"\nprovider = \"a\"\nlb = \"p2c\"\nmax_attempts = 1\nretry_on = []\n\
         breaker = {{ cooldown_ms = 50 }}\ntimeout_ms = 100\n"
    ))
    .unwrap();
    let x = c.policy(&c.models[0]);
    assert_eq!(x.lb, Lb::Weighted);
    assert_eq!(x.max_attempts, 4);
    assert!(x.retryable(Reason::Connect) && x.retryable(Reason::Status503));
    assert!(!x.retryable(Reason::Status500));
    assert_eq!(x.breaker.failures, 2);
    assert_eq!(x.breaker.error_rate, Some(0.5));
    assert_eq!(x.deadline, Duration::from_millis(9000));
    assert_eq!(x.first_byte_timeout, Duration::from_millis(700));
    let y = c.policy(&c.models[1]);
    assert_eq!(y.lb, Lb::P2c);
    assert_eq!(y.max_attempts, 1);
    assert_eq!(y.retry_on, RetrySet::empty());
    assert_eq!(y.breaker.failures, 2, "inherited from [routing]");
    assert_eq!(y.breaker.cooldown, Duration::from_millis(50));
    assert_eq!(y.deadline, Duration::from_millis(100));
    // no [routing] at all: documented defaults
    let c = Config::parse(&format!(
        "{PROVIDERS}[[model]]\nname = \"m\"\nprovider = \"a\"\n"
    ))
    .unwrap();
    let d = c.policy(&c.models[0]);
    assert_eq!((d.lb, d.max_attempts, d.breaker.failures), (Lb::P2c, 3, 5));
    assert_eq!(d.breaker.cooldown, Duration::from_secs(10));
    assert_eq!(
        d.first_byte_timeout,
        Duration::from_millis(c.upstream.first_byte_timeout_ms)
    );
}

#[test]
fn rejects_with_line_numbers() {
    // (models text after the 7 provider lines, expected (line, message fragment) list)
    let cases: [(&str, &[(usize, &str)]); 12] = [
        (
            "[[model]]\nname = \"m\"\ndeployments = [\n  { provider = \"a\" },\n  { provider = \"nope\" },\n]\n",
            &[(12, "unknown provider \"nope\"")],
        ),
        (
            "[[model]]\nname = \"m\"\ndeployments = [{ provider = \"a\", weight = 0 }]\n",
            &[(10, "weight 0 must be > 0")],
        ),
        (
            "[[model]]\nname = \"m\"\ndeployments = [\n  { provider = \"a\", weight = -2 },\n]\n",
            &[(11, "weight -2 must be > 0")],
        ),
        (
            "[[model]]\nname = \"A\"\nprovider = \"a\"\nfallbacks = [\"B\"]\n\n[[model]]\nname = \"B\"\nprovider = \"b\"\nfallbacks = [\"A\"]\n",
            &[(16, "fallback cycle A → B → A")],
        ),
        (
            "[[model]]\nname = \"A\"\nprovider = \"a\"\nfallbacks = [\"A\"]\n",
            &[(11, "falls back to itself")],
        ),
        (
            // via a prefix model: "gpt-4o" resolves to "gpt-*" itself
            "[[model]]\nname = \"gpt-*\"\nprovider = \"a\"\nfallbacks = [\"gpt-4o\"]\n",
            &[(11, "falls back to itself")],
        ),
        (
            "[[model]]\nname = \"A\"\nprovider = \"a\"\nfallbacks = [\"claude-3\"]\n\n[[model]]\nname = \"claude-*\"\nprovider = \"b\"\nfallbacks = [\"A\"]\n",
            &[(16, "fallback cycle A → claude-* → A")],
        ),
        (
            "[[model]]\nname = \"m\"\nprovider = \"a\"\nfallbacks = [\"ghost\"]\n",
            &[(11, "fallback \"ghost\" is not a configured model")],
        ),
        (
            "[[model]]\nname = \"m\"\nprovider = \"a\"\nmax_attempts = 0\n",
            &[(11, "max_attempts must be between 1")],
        ),
        (
            "[[model]]\nname = \"m\"\nprovider = \"a\"\ndeployments = [{ provider = \"b\" }]\n",
            &[(11, "not both")],
        ),
        (
            "[[model]]\nname = \"m\"\n",
            &[(9, "needs a provider")],
        ),
        (
            "[[model]]\nname = \"m\"\nprovider = \"a\"\nretry_on = [\"connect\", \"404\"]\n",
            &[(11, "unknown retry_on \"404\"")],
        ),
    ];
    for (models, want) in cases {
        let got = errors(models);
        assert_eq!(got.len(), want.len(), "{models}\n{got:?}");
        for ((line, msg), (wl, wm)) in got.iter().zip(want.iter()) {
            assert_eq!(*line, Some(*wl), "{models}\n{got:?}");
            assert!(msg.contains(wm), "{msg:?} lacks {wm:?}");
        }
    }
}

#[test]
fn more_rejects() {
    let cases: [(&str, &str); 8] = [
        ("[[model]]\nname = \"m\"\ndeployments = []\n", "must not be empty"),
        (
            "[[model]]\nname = \"m\"\nupstream_model = \"x\"\ndeployments = [{ provider = \"a\" }]\n",
            "inside each deployment",
        ),
        (
            "[[model]]\nname = \"m\"\ndeployments = [{ provider = \"a\" }, { provider = \"a\" }]\n",
            "listed twice",
        ),
        ("[[model]]\nname = \"m\"\nprovider = \"a\"\nlb = \"random\"\n", "unknown variant"),
        (
            "[[model]]\nname = \"m\"\nprovider = \"a\"\nbreaker = { failures = 1, cooldown_ms = 0 }\n",
            "cooldown_ms",
        ),
        (
            "[[model]]\nname = \"m\"\nprovider = \"a\"\nbreaker = { error_rate = 1.5 }\n",
            "error_rate",
        ),
        ("[routing]\nmax_attempts = 0\n", "[routing]: max_attempts"),
        (
            "[[model]]\nname = \"m\"\ndeployments = [{ provider = \"a\", wieght = 2 }]\n",
            "unknown field",
        ),
    ];
    for (models, want) in cases {
        let got = errors(models);
        assert_eq!(got.len(), 1, "{models}\n{got:?}");
        assert!(got[0].0.is_some(), "no line: {got:?}");
        assert!(got[0].1.contains(want), "{got:?} lacks {want:?}");
    }
}

#[test]
fn fallback_chains_without_cycles_pass() {
    // diamond: m → f1, f2; f1 → f3; f2 → f3
    let ok = errors(
        "[[model]]\nname = \"m\"\nprovider = \"a\"\nfallbacks = [\"f1\", \"f2\"]\n\
         [[model]]\nname = \"f1\"\nprovider = \"a\"\nfallbacks = [\"f3\"]\n\
         [[model]]\nname = \"f2\"\nprovider = \"b\"\nfallbacks = [\"f3\"]\n\
         [[model]]\nname = \"f3\"\nprovider = \"b\"\n",
    );
    assert!(ok.is_empty(), "{ok:?}");
    // a longer cycle is reported once
    let got = errors(
        "[[model]]\nname = \"x\"\nprovider = \"a\"\nfallbacks = [\"y\"]\n\
         [[model]]\nname = \"y\"\nprovider = \"a\"\nfallbacks = [\"z\"]\n\
         [[model]]\nname = \"z\"\nprovider = \"a\"\nfallbacks = [\"x\"]\n",
    );
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(got[0].1.contains("x → y → z → x"), "{got:?}");
}

#[test]
fn api_keys_are_weighted_and_checked() {
    let c = Config::parse(
        "[[provider]]\nname = \"a\"\nkind = \"openai\"\nbase_url = \"http://h/v1\"\n\
         api_key_env = \"A_KEY\"\napi_keys = [{ env = \"A_KEY2\", weight = 2 }, { env = \"A_KEY3\" }]\n",
    )
    .unwrap();
    assert_eq!(
        c.providers[0].key_refs(),
        vec![("A_KEY", 1), ("A_KEY2", 2), ("A_KEY3", 1)]
    );
    let errs = Config::parse(
        "[[provider]]\nname = \"a\"\nkind = \"openai\"\nbase_url = \"http://h/v1\"\n\
         api_key_env = \"A_KEY\"\napi_keys = [\n  { env = \"A_KEY\" },\n  { env = \"sk-123\", weight = 0 },\n]\n",
    )
    .unwrap_err();
    let lines: Vec<_> = errs.iter().map(|e| (e.line, e.message.as_str())).collect();
    assert_eq!(errs.len(), 3, "{lines:?}");
    assert_eq!(errs[0].line, Some(7));
    assert!(errs[0].message.contains("listed twice"));
    assert_eq!(errs[1].line, Some(8));
    assert!(errs[1].message.contains("NAME"));
    assert_eq!(errs[2].line, Some(8));
    assert!(errs[2].message.contains("weight 0"));
}
