//! Tests of `upstream::exchange`: the response head and its framing.

use super::*;

#[test]
fn common_content_types_are_borrowed_others_copied_byte_for_byte() {
    let head = |ct: &str| {
        let raw = format!("HTTP/1.1 200 OK\r\nContent-Type: {ct}\r\nContent-Length: 0\r\n\r\n");
        parse_response_head(raw.as_bytes()).unwrap().unwrap().0
    };
    for ct in COMMON_TYPES {
        let h = head(std::str::from_utf8(ct).unwrap());
        assert!(matches!(h.content_type, Cow::Borrowed(_)));
        assert_eq!(&*h.content_type, ct);
    }
    let h = head("Application/JSON; charset=UTF-8");
    assert!(matches!(h.content_type, Cow::Owned(_)));
    assert_eq!(&*h.content_type, b"Application/JSON; charset=UTF-8");
    assert!(head("TEXT/Event-Stream").is_event_stream());
}

#[test]
fn response_head_table() {
    let raw = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-Request-Id: r1\r\nServer: x\r\n\r\nhello";
    let (h, n) = parse_response_head(raw).unwrap().unwrap();
    assert_eq!(
        (h.status, h.framing, h.keep_alive),
        (200, RespFraming::Length(5), true)
    );
    assert_eq!(h.forward, b"x-upstream-request-id: r1\r\n");
    assert_eq!(&raw[n..], b"hello");
    let (h, _) = parse_response_head(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: text/event-stream\r\n\r\n",
    )
    .unwrap()
    .unwrap();
    assert_eq!(h.framing, RespFraming::Chunked);
    assert!(h.is_event_stream());
    let (h, _) = parse_response_head(b"HTTP/1.1 200 OK\r\n\r\n")
        .unwrap()
        .unwrap();
    assert_eq!((h.framing, h.keep_alive), (RespFraming::Close, false));
    let (h, _) =
        parse_response_head(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n")
            .unwrap()
            .unwrap();
    assert_eq!((h.status, h.framing), (204, RespFraming::Length(0)));
    assert!(parse_response_head(b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n").is_err());
    // Thousands of interim heads: an error, not a stack overflow (fuzz-found).
    let mut many = b"HTTP/1.1 100 \r\n\r\n".repeat(4000);
    many.extend_from_slice(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}");
    assert!(parse_response_head(&many).is_err());
    let mut few = b"HTTP/1.1 103 Early Hints\r\nLink: x\r\n\r\n".repeat(3);
    few.extend_from_slice(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}");
    let (h, n) = parse_response_head(&few).unwrap().unwrap();
    assert_eq!((h.status, &few[n..]), (200, &b"{}"[..]));
    assert!(parse_response_head(b"HTTP/1.1 200 OK\r\n")
        .unwrap()
        .is_none());
}
