//! Tests of `dialect::extract`: the routing scan against serde_json, its bounds, the splice.

use super::*;

#[test]
fn table() {
    let ok: &[(&str, &str, bool)] = &[
        (r#"{"model":"a","messages":[]}"#, "a", false),
        (
            r#"{"messages":[{"content":"model"}],"stream":true,"model":"gpt-4o"}"#,
            "gpt-4o",
            true,
        ),
        (r#" { "stream" : null , "model" : "x\/y" } "#, "x/y", false),
        (r#"{"model":"gpt\u002d4"}"#, "gpt-4", false),
        (
            "{\"model\":\"a\",\"m\":{\"model\":1,\"stream\":2}}\r\n \t",
            "a",
            false,
        ),
    ];
    for (body, model, stream) in ok {
        let f = routing_fields(body.as_bytes()).unwrap();
        assert_eq!((f.model.as_str(), f.stream), (*model, *stream), "{body}");
    }
    let bad: &[(&str, &str)] = &[
        ("", "empty"),
        ("{", "valid JSON"),
        (r#"{"messages":[]}"#, "missing"),
        (r#"{"model":3}"#, "string"),
        (r#"{"model":"a","stream":"yes"}"#, "boolean"),
        (r#"[1,2]"#, "JSON object"),
        // not a model identifier (it may become part of an upstream path)
        (r#"{"model":"\u00e9"}"#, "valid model name"),
        (r#"{"model":""}"#, "valid model name"),
        (r#"{"model":"a\r\nb"}"#, "valid model name"),
        (r#"{"model":"../x"}"#, "valid model name"),
        (r#"{"model":"a?b"}"#, "valid model name"),
        // duplicate routing keys: the gateway and the upstream might read different ones
        (r#"{"model":"a","model":"b"}"#, "duplicate \"model\""),
        (r#"{"model":"a","mod\u0065l":"b"}"#, "duplicate \"model\""),
        (
            r#"{"stream":false,"model":"a","stream":true}"#,
            "duplicate \"stream\"",
        ),
        // trailing data after the object
        (r#"{"model":"a"} x"#, "after its JSON object"),
        (r#"{"model":"a"}{"model":"b"}"#, "after its JSON object"),
        (r#"{"model":"a"}}"#, "after its JSON object"),
        (r#"{"model":"a"},"#, "after its JSON object"),
        (r#"{"model":"a" } \n {}"#, "after its JSON object"),
        ("{} x", "after its JSON object"),
    ];
    for (body, want) in bad {
        let e = routing_fields(body.as_bytes()).unwrap_err();
        assert_eq!(e.status(), 400, "{body}");
        assert!(e.message.contains(want), "{body}: {}", e.message);
    }
}

#[test]
fn deep_nesting_is_refused_before_parsing() {
    for (open, close) in [("[", "]"), ("{\"a\":", "}")] {
        let inner = format!("{}{}", open.repeat(12_000), close.repeat(12_000));
        for body in [
            format!(r#"{{"model":"m","messages":{inner}}}"#),
            format!(r#"{{"messages":{inner},"model":"m"}}"#),
            format!(r#"{{"model":"m"}} {inner}"#),
            inner.clone(),
        ] {
            let e = routing_fields(body.as_bytes()).unwrap_err();
            assert_eq!(e.status(), 400);
            assert!(
                e.message.contains("nested deeper than 128"),
                "{}",
                e.message
            );
        }
    }
    // 128 levels in all (the top-level object is one of them) still pass, on a stack the
    // size of a shard's (sonic-rs recurses once per level: ~6.7 MiB in debug builds).
    let ok = format!(
        r#"{{"model":"m","x":{}{}}}"#,
        "[".repeat(127),
        "]".repeat(127)
    );
    let parsed = std::thread::Builder::new()
        .stack_size(crate::runtime::STACK_BYTES)
        .spawn(move || routing_fields(ok.as_bytes()).map(|f| f.model))
        .unwrap()
        .join()
        .unwrap();
    assert_eq!(parsed.unwrap(), "m");
}

#[test]
fn gemini_bodies() {
    let call = crate::dialect::gemini::call::Call {
        model: "g".into(),
        stream: true,
    };
    let f = gemini_fields(
        br#"{"contents":[],"generationConfig":{"temperature":1,"maxOutputTokens":7}}"#,
        &call,
    )
    .unwrap();
    assert_eq!(
        (f.model.as_str(), f.stream, f.max_tokens, f.model_span),
        ("g", true, Some(7), 0..0)
    );
    let f = gemini_fields(br#"{"contents":[],"max_tokens":9}"#, &call).unwrap();
    assert_eq!(f.max_tokens, None, "not a Gemini field");
    assert!(gemini_fields(b" { } ", &call).is_ok());
    for bad in [
        &b""[..],
        b"[]",
        b"{",
        b"{} x",
        br#"{"contents":[]} {}"#,
        b"1",
        br#""s""#,
    ] {
        let e = gemini_fields(bad, &call).unwrap_err();
        assert_eq!(e.status(), 400, "{:?}", String::from_utf8_lossy(bad));
    }
    let deep = format!("{{\"contents\":{}{}}}", "[".repeat(200), "]".repeat(200));
    assert_eq!(
        gemini_fields(deep.as_bytes(), &call).unwrap_err().status(),
        400
    );
}

#[test]
fn the_same_pass_reads_caps_sampling_and_usage() {
    let f = routing_fields(
        br#"{"temperature":0.5,"model":"m","top_p":1,"messages":[{"temperature":9}],"max_completion_tokens":7,"max_tokens":9,"stream_options":{"include_usage":true}}"#,
    )
    .unwrap();
    assert_eq!(f.max_tokens, Some(7), "the first whole number");
    assert_eq!(
        (f.sampling.temperature(), f.sampling.top_p()),
        (Some(0.5), Some(1.0))
    );
    assert_eq!(f.usage_option, UsageOption::Asked);
    let body = br#"{"model":"m","stream":true,"stream_options":{"include_usage":false},"max_tokens":16.0,"temperature":"hot"}"#;
    let f = routing_fields(body).unwrap();
    assert_eq!((f.max_tokens, f.sampling.temperature()), (None, None));
    let UsageOption::NotAsked(span) = &f.usage_option else {
        panic!("{:?}", f.usage_option);
    };
    assert_eq!(&body[span.clone()], br#"{"include_usage":false}"#);
    let f = routing_fields(br#"{"model":"m","stream_options":null,"stream_options":{}}"#);
    assert_eq!(f.unwrap().usage_option, UsageOption::Unclear);
    // escaped keys are the keys they spell
    let f = routing_fields(br#"{"\u006dodel":"a\/b","str\u0065am":true,"top\u005fp":0.25}"#);
    let f = f.unwrap();
    assert_eq!(
        (f.model.as_str(), f.stream, f.sampling.top_p()),
        ("a/b", true, Some(0.25))
    );
    let e = routing_fields(br#"{"model":"a","\u0073tream":true,"stream":false}"#).unwrap_err();
    assert!(e.message.contains("duplicate \"stream\""), "{}", e.message);
    // a long escaped key is none of the routing keys
    let long = format!(r#"{{"model":"a","\u006d{}":1}}"#, "o".repeat(40));
    assert_eq!(routing_fields(long.as_bytes()).unwrap().model, "a");
    // a model spelled with a surrogate pair, and a lone surrogate (no character)
    // (an emoji is not a model identifier: refused after unescaping, as a lone surrogate)
    let e = routing_fields(br#"{"model":"m\ud83d\ude00"}"#).unwrap_err();
    assert!(e.message.contains("valid model name"), "{}", e.message);
    assert_eq!(
        routing_fields(br#"{"model":"m\ud83d"}"#)
            .unwrap_err()
            .status(),
        400
    );
    let call = crate::dialect::gemini::call::Call {
        model: "g".into(),
        stream: false,
    };
    let f = gemini_fields(
        br#"{"generationConfig":{"max_output_tokens":3,"temperature":0.1,"topP":0.9,"maxOutputTokens":5}}"#,
        &call,
    )
    .unwrap();
    assert_eq!(
        (f.max_tokens, f.sampling.temperature(), f.sampling.top_p()),
        (Some(5), Some(0.1), Some(0.9))
    );
}

#[test]
fn values_are_skipped_whole() {
    // brackets and quotes inside strings, nested containers, numbers and literals before
    // the routing keys
    let body = br#"{"a":"}]\"{[","b":[{"c":[1,2,{"d":"]"}]},-1.5e3,true,null],"e":{},"f":[],"model":"x","g":"\\","stream":false}"#;
    let f = routing_fields(body).unwrap();
    assert_eq!((f.model.as_str(), f.stream), ("x", false));
    assert_eq!(&body[f.model_span.clone()], br#""x""#);
    for bad in [
        &br#"{"model":"a","x":[}"#[..],
        br#"{"model":"a","x":"\q"}"#,
        b"{\"model\":\"a\xff\"}",
    ] {
        let e = routing_fields(bad).unwrap_err();
        assert!(e.message.contains("valid JSON"), "{}", e.message);
    }
}

#[test]
fn splice_keeps_the_rest_byte_for_byte() {
    let body = br#"{ "model" : "alias", "messages":[{"role":"user","content":"hi"}] }"#;
    let f = routing_fields(body).unwrap();
    let out = splice(body, &f, Some("real-\"model"), false);
    assert_eq!(
        std::str::from_utf8(&out).unwrap(),
        r#"{ "model" : "real-\"model", "messages":[{"role":"user","content":"hi"}] }"#
    );
    // with the usage ask: inserted first without `stream_options`, else that value rewritten
    let out = splice(body, &f, Some("m"), true);
    assert_eq!(
        std::str::from_utf8(&out).unwrap(),
        r#"{"stream_options":{"include_usage":true}, "model" : "m", "messages":[{"role":"user","content":"hi"}] }"#
    );
    let body = br#"{"model":"a","stream_options":{"x":1,"include_usage":false}}"#;
    let f = routing_fields(body).unwrap();
    let out = splice(body, &f, None, true);
    assert_eq!(
        std::str::from_utf8(&out).unwrap(),
        r#"{"model":"a","stream_options":{"x":1,"include_usage":true}}"#
    );
}
