use super::*;

fn chunked(ct: &str, body: &[u8]) -> Vec<u8> {
    let mut out = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: {ct}\r\ntransfer-encoding: chunked\r\nx-ringgate-cache: miss\r\n\r\n"
    )
    .into_bytes();
    for piece in body.chunks(37) {
        out.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
        out.extend_from_slice(piece);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"0\r\n\r\n");
    out
}

fn with_length(status: u16, body: &[u8]) -> Vec<u8> {
    let mut out = format!(
        "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body);
    out
}

const CHAT: &str = r#"{"id":"chatcmpl-1","object":"chat.completion","created":7,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"Paris is the capital."},"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":5,"total_tokens":14}}"#;

const MESSAGES: &str = r#"{"id":"msg_1","type":"message","role":"assistant","model":"m","content":[{"type":"text","text":"Paris is the capital."}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":9,"output_tokens":5}}"#;

/// Text of a replayed or live stream, per dialect.
fn stream_text(dialect: Dialect, sse: &[u8]) -> String {
    let mut text = String::new();
    for e in events(sse) {
        let Ok(v) = serde_json::from_str::<Value>(&e.data) else {
            continue;
        };
        let piece = match dialect {
            Dialect::Chat => v["choices"][0]["delta"]["content"].as_str(),
            Dialect::Messages => v["delta"]["text"].as_str(),
            Dialect::Responses => (v["type"] == "response.output_text.delta")
                .then(|| v["delta"].as_str())
                .flatten(),
            Dialect::Gemini => None,
        };
        text.push_str(piece.unwrap_or(""));
    }
    text
}

#[test]
fn non_stream_answers_are_kept_as_sent() {
    let s = record(
        &with_length(200, CHAT.as_bytes()),
        Dialect::Chat,
        "m",
        false,
    )
    .unwrap();
    assert_eq!(s.body, CHAT.as_bytes());
    assert_eq!(s.usage.prompt_tokens, Some(9));
    assert_eq!(s.usage.completion_tokens, Some(5));
    let (body, ct) = replay(&s.body, Dialect::Chat, false, "m", false).unwrap();
    assert_eq!(
        (body.as_slice(), ct),
        (CHAT.as_bytes(), &b"application/json"[..])
    );
}

#[test]
fn errors_cuts_and_length_stops_are_refused() {
    let r = |raw: &[u8], allow| record(raw, Dialect::Chat, "m", allow);
    assert!(r(&with_length(500, CHAT.as_bytes()), false).is_err());
    assert!(r(&with_length(200, br#"{"error":{"message":"x"}}"#), false).is_err());
    let length = CHAT.replace("\"stop\"", "\"length\"");
    assert_eq!(
        r(&with_length(200, length.as_bytes()), false),
        Err("length stop")
    );
    assert!(r(&with_length(200, length.as_bytes()), true).is_ok());
    // a body shorter than its length, a chunked body without its last chunk
    let mut cut = with_length(200, CHAT.as_bytes());
    cut.truncate(cut.len() - 3);
    assert!(r(&cut, false).is_err());
    let mut cut = chunked("application/json", CHAT.as_bytes());
    cut.truncate(cut.len() - 5);
    assert!(r(&cut, false).is_err());
    let m = MESSAGES.replace("end_turn", "max_tokens");
    assert!(record(
        &with_length(200, m.as_bytes()),
        Dialect::Messages,
        "m",
        false
    )
    .is_err());
}

#[test]
fn every_dialect_round_trips_between_stream_and_json() {
    for (dialect, json) in [
        (Dialect::Chat, CHAT.to_string()),
        (Dialect::Messages, MESSAGES.to_string()),
        (
            Dialect::Responses,
            String::from_utf8(
                dialect::chat_to_response(
                    Dialect::Responses,
                    &serde_json::from_str(CHAT).unwrap(),
                    "m",
                )
                .unwrap(),
            )
            .unwrap(),
        ),
    ] {
        let stored = record(&with_length(200, json.as_bytes()), dialect, "m", false).unwrap();
        // a stream client is answered from the non-stream entry with a well-formed stream
        let (sse, ct) = replay(&stored.body, dialect, true, "m", true).unwrap();
        assert_eq!(ct, b"text/event-stream");
        assert_eq!(
            stream_text(dialect, &sse),
            "Paris is the capital.",
            "{dialect:?}"
        );
        // and that stream, recorded as a miss would be, is stored as the same answer
        let again = record(&chunked("text/event-stream", &sse), dialect, "m", false).unwrap();
        let a = dialect::response_to_chat(dialect, &again.body).unwrap();
        let b = dialect::response_to_chat(dialect, &stored.body).unwrap();
        assert_eq!(
            a["choices"][0]["message"]["content"],
            b["choices"][0]["message"]["content"]
        );
        assert_eq!(again.usage.completion_tokens, Some(5), "{dialect:?}");
        // a stream cut before its end is not stored
        let cut = &sse[..sse.len() / 2];
        assert!(record(&chunked("text/event-stream", cut), dialect, "m", false).is_err());
    }
}

#[test]
fn chat_replay_golden() {
    let (sse, _) = replay(CHAT.as_bytes(), Dialect::Chat, true, "m", true).unwrap();
    let want = concat!(
        "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":7,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n",
        "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":7,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Paris is the capital.\"},\"finish_reason\":null}]}\n\n",
        "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":7,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
        "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":7,\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":5,\"total_tokens\":14}}\n\n",
        "data: [DONE]\n\n",
    );
    assert_eq!(String::from_utf8(sse).unwrap(), want);
}
