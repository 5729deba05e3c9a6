//! The usage-only chunk of an OpenAI Chat stream (`"choices":[]` with a `"usage"` object),
//! taken out of what a client receives when the gateway asked for it on the client's behalf
//! (see `plan`). Other chunks with empty `choices` (Azure's `prompt_filter_results`) and
//! chunks that carry usage next to a choice are relayed as they are.
//!
//! Owns: `is_usage_only`, `without`. Must not: parse JSON (a byte scan of whole events;
//! inside a JSON string every quote is escaped, so `"choices"` or `"usage"` followed by `:`
//! only match real keys) or touch other events' bytes.

/// Whether one whole SSE event is a Chat usage-only chunk.
pub fn is_usage_only(ev: &[u8]) -> bool {
    key_then(ev, b"\"choices\"", b"[]") && key_then(ev, b"\"usage\"", b"{")
}

/// Whether `key` occurs followed by optional whitespace, `:`, optional whitespace and `then`
/// (whose bytes may be separated by whitespace too).
fn key_then(ev: &[u8], key: &[u8], then: &[u8]) -> bool {
    memchr::memmem::find_iter(ev, key).any(|i| {
        let mut rest = ev.get(i + key.len()..).unwrap_or_default().iter();
        let mut want = std::iter::once(&b':').chain(then.iter());
        let mut next = want.next();
        for b in rest.by_ref() {
            let Some(w) = next else { break };
            if b == w {
                next = want.next();
            } else if !b.is_ascii_whitespace() {
                return false;
            }
        }
        next.is_none()
    })
}

/// `events` (whole SSE events) without the usage-only ones, into `kept` (cleared first); false,
/// with `kept` untouched, when there is no usage in them (one `memmem` over the events).
pub fn without(events: &[u8], kept: &mut Vec<u8>) -> bool {
    if memchr::memmem::find(events, b"\"usage\"").is_none() {
        return false;
    }
    kept.clear();
    kept.reserve(events.len());
    for ev in crate::dialect::sse::events(events) {
        if !is_usage_only(ev) {
            kept.extend_from_slice(ev);
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::response::write_chunk;

    /// `events` as one chunk without the usage-only ones, as the relay writes them.
    fn write_without(out: &mut Vec<u8>, events: &[u8]) {
        let mut kept = Vec::new();
        if without(events, &mut kept) {
            write_chunk(out, &kept);
        } else {
            write_chunk(out, events);
        }
    }

    const CHUNK: &[u8] = b"data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\n\n";
    const USAGE: &[u8] = b"data: {\"id\":\"c\",\"choices\": [ ],\"usage\": {\"prompt_tokens\":3,\"completion_tokens\":1,\"total_tokens\":4}}\n\n";
    const DONE: &[u8] = b"data: [DONE]\n\n";

    #[test]
    fn only_the_usage_chunk_goes() {
        assert!(is_usage_only(USAGE));
        assert!(!is_usage_only(CHUNK));
        let azure = b"data: {\"choices\":[],\"prompt_filter_results\":[{\"prompt_index\":0}]}\n\n";
        assert!(!is_usage_only(azure));
        let both = b"data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":{\"total_tokens\":4}}\n\n";
        assert!(!is_usage_only(both));
        let quoted = b"data: {\"choices\":[{\"delta\":{\"content\":\"\\\"choices\\\":[] \\\"usage\\\":{\"}}]}\n\n";
        assert!(!is_usage_only(quoted));
        let events = [CHUNK, USAGE, DONE].concat();
        let mut out = Vec::new();
        write_without(&mut out, &events);
        let want = [CHUNK, DONE].concat();
        assert_eq!(
            out,
            [format!("{:x}\r\n", want.len()).as_bytes(), &want, b"\r\n"].concat()
        );
        let crlf = String::from_utf8(events.clone())
            .unwrap()
            .replace("\n", "\r\n");
        let mut out = Vec::new();
        write_without(&mut out, crlf.as_bytes());
        assert!(!String::from_utf8(out).unwrap().contains("prompt_tokens"));
        // only the usage chunk in this batch: nothing is written
        let mut out = Vec::new();
        write_without(&mut out, USAGE);
        assert!(out.is_empty());
    }
}
