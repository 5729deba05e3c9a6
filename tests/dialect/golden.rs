//! Golden tests for `ringgate::dialect`.
//!
//! Layout: `tests/golden/<converter>/<case>.in.json` → `<case>.out.json`
//! (compared as parsed JSON) and `<case>.in.sse` → `<case>.out.sse`
//! (compared byte for byte). `<converter>` names the conversion:
//!
//! * `request_in_<dialect>`   client body → hub (`request_to_chat`)
//! * `request_out_<dialect>`  hub → upstream body (`chat_to_request`, model `upstream-model`)
//! * `response_in_<dialect>`  upstream body → hub (`response_to_chat`)
//! * `response_out_<dialect>` hub → client body (`chat_to_response`, model `client-model`)
//! * `stream_<up>_to_<client>` upstream SSE → client SSE (`StreamTranslator`,
//!   model `client-model`, Chat usage chunk on)
//!
//! With `RINGGATE_BLESS=1` the `.out` files are rewritten instead.

use ringgate::dialect::{self, Dialect, SseDecoder, StreamTranslator};
use std::path::{Path, PathBuf};

fn dialect(name: &str) -> Dialect {
    match name {
        "chat" => Dialect::Chat,
        "responses" => Dialect::Responses,
        "messages" => Dialect::Messages,
        "gemini" => Dialect::Gemini,
        other => panic!("unknown dialect {other}"),
    }
}

fn run_json(converter: &str, input: &[u8]) -> serde_json::Value {
    let (kind, d) = converter.rsplit_once('_').expect("converter name");
    let d = dialect(d);
    let hub = || serde_json::from_slice::<serde_json::Value>(input).expect("hub json");
    let bytes = match kind {
        "request_in" => {
            serde_json::to_vec(&dialect::request_to_chat(d, input).expect("convert")).unwrap()
        }
        "request_out" => dialect::chat_to_request(d, &hub(), "upstream-model").expect("convert"),
        "response_in" => {
            serde_json::to_vec(&dialect::response_to_chat(d, input).expect("convert")).unwrap()
        }
        "response_out" => dialect::chat_to_response(d, &hub(), "client-model").expect("convert"),
        other => panic!("unknown converter kind {other}"),
    };
    serde_json::from_slice(&bytes).expect("output json")
}

fn run_stream(converter: &str, input: &[u8], byte_at_a_time: bool) -> Vec<u8> {
    let rest = converter.strip_prefix("stream_").expect("stream converter");
    let (up, client) = rest.split_once("_to_").expect("stream_<up>_to_<client>");
    let mut t =
        StreamTranslator::new(dialect(up), dialect(client), "client-model").with_chat_usage(true);
    let mut dec = SseDecoder::new();
    let mut out = Vec::new();
    let chunks: Vec<&[u8]> = if byte_at_a_time {
        input.chunks(1).collect()
    } else {
        vec![input]
    };
    for c in chunks {
        dec.feed(c);
        while let Some(ev) = dec.next_event() {
            t.push(&ev, &mut out).expect("push");
        }
    }
    dec.finish();
    while let Some(ev) = dec.next_event() {
        t.push(&ev, &mut out).expect("push");
    }
    t.finish(&mut out);
    out
}

fn files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| e.unwrap().path())
        .collect();
    v.sort();
    v
}

#[test]
fn golden() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let bless = std::env::var("RINGGATE_BLESS").is_ok_and(|v| v == "1");
    let mut failures = Vec::new();
    let mut count = 0;
    for dir in files(&root).into_iter().filter(|p| p.is_dir()) {
        let converter = dir.file_name().unwrap().to_str().unwrap().to_string();
        for f in files(&dir) {
            let name = f.file_name().unwrap().to_str().unwrap().to_string();
            let input = std::fs::read(&f).unwrap();
            if let Some(case) = name.strip_suffix(".in.json") {
                count += 1;
                let got = run_json(&converter, &input);
                let out = dir.join(format!("{case}.out.json"));
                if bless {
                    let mut text = serde_json::to_string_pretty(&got).unwrap();
                    text.push('\n');
                    std::fs::write(&out, text).unwrap();
                    continue;
                }
                let want: serde_json::Value =
                    serde_json::from_slice(&std::fs::read(&out).unwrap_or_default())
                        .unwrap_or(serde_json::Value::Null);
                if got != want {
                    failures.push(format!(
                        "{converter}/{case}: got\n{}",
                        serde_json::to_string_pretty(&got).unwrap()
                    ));
                }
            } else if let Some(case) = name.strip_suffix(".in.sse") {
                count += 1;
                let got = run_stream(&converter, &input, false);
                let bytewise = run_stream(&converter, &input, true);
                assert_eq!(got, bytewise, "{converter}/{case}: byte-at-a-time differs");
                let out = dir.join(format!("{case}.out.sse"));
                if bless {
                    std::fs::write(&out, &got).unwrap();
                    continue;
                }
                if std::fs::read(&out).unwrap_or_default() != got {
                    failures.push(format!(
                        "{converter}/{case}: got\n{}",
                        String::from_utf8_lossy(&got)
                    ));
                }
            }
        }
    }
    assert!(count > 0, "no golden cases found");
    assert!(
        failures.is_empty(),
        "{} golden mismatches:\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}
