//! A bounded look into the start of a `multipart/form-data` body (RFC 7578): the boundary from
//! the `Content-Type`, and one small text field (the `model` of a transcription or an image
//! edit) found in the first parts, so the request can be routed before the rest of the body —
//! the file — is streamed on untouched.
//!
//! Bounds: the caller passes at most its prefix (`surface` holds 64 KiB); a part's headers may
//! take [`MAX_PART_HEAD`] bytes, the field's value [`MAX_VALUE`], and at most [`MAX_PARTS`] parts
//! are looked at. Nothing allocates: the answer is a byte range of the input.
//!
//! Owns: `boundary`, `find_field`. Must not: read sockets, decode the file parts or buffer.

use std::ops::Range;

/// Longest part header block looked at.
pub const MAX_PART_HEAD: usize = 8 << 10;
/// Longest field value accepted (a model id is at most 256 bytes).
pub const MAX_VALUE: usize = 1024;
/// Parts looked at before giving up.
pub const MAX_PARTS: usize = 32;
/// Longest boundary (RFC 2046 §5.1.1).
const MAX_BOUNDARY: usize = 70;

/// What a look at the bytes so far found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scan {
    /// The field's value is at this range of the input.
    Found(Range<usize>),
    /// The answer lies further on: give more bytes (if the prefix may still grow).
    More,
    /// The body's parts ended, or the part limit was reached, without the field.
    Missing,
}

/// The boundary of a `multipart/form-data` Content-Type value; `Err` says why not.
pub fn boundary(content_type: &[u8]) -> Result<&[u8], &'static str> {
    let mut parts = content_type.split(|&b| b == b';');
    let media = trim(parts.next().unwrap_or_default());
    if !media.eq_ignore_ascii_case(b"multipart/form-data") {
        return Err("is not multipart/form-data");
    }
    for p in parts {
        let p = trim(p);
        let Some(eq) = p.iter().position(|&b| b == b'=') else {
            continue;
        };
        if !trim(&p[..eq]).eq_ignore_ascii_case(b"boundary") {
            continue;
        }
        let mut v = trim(&p[eq + 1..]);
        if v.len() >= 2 && v[0] == b'"' && v[v.len() - 1] == b'"' {
            v = &v[1..v.len() - 1];
        }
        let ok = (1..=MAX_BOUNDARY).contains(&v.len())
            && v.iter()
                .all(|&b| b.is_ascii_alphanumeric() || b"'()+_,-./:=? ".contains(&b))
            && v.last() != Some(&b' ');
        return if ok {
            Ok(v)
        } else {
            Err("has an invalid multipart boundary")
        };
    }
    Err("names no multipart boundary")
}

/// Look for the text field `name` in `body` (the body's first bytes; `complete`: all of it).
/// Parts are read in order; a part with a `filename` is skipped like any other when its end is
/// in view, else the answer is `More`.
pub fn find_field(
    body: &[u8],
    boundary: &[u8],
    name: &[u8],
    complete: bool,
) -> Result<Scan, &'static str> {
    let more = |why| if complete { Err(why) } else { Ok(Scan::More) };
    let mut delim = Vec::with_capacity(boundary.len() + 4);
    delim.extend_from_slice(b"\r\n--");
    delim.extend_from_slice(boundary);
    // the first delimiter: at the very start, or after a preamble line
    let mut at = if body.starts_with(&delim[2..]) {
        delim.len() - 2
    } else {
        let window = &body[..body.len().min(MAX_PART_HEAD)];
        match memchr::memmem::find(window, &delim) {
            Some(i) => i + delim.len(),
            None if body.len() >= MAX_PART_HEAD => return Err("no multipart boundary in the body"),
            None => return more("the body ends before its first multipart boundary"),
        }
    };
    for _ in 0..MAX_PARTS {
        // after a delimiter: `--` closes the body, CRLF starts a part
        let Some(after) = body.get(at..at + 2) else {
            return more("the body ends inside a multipart delimiter");
        };
        if after == b"--" {
            return Ok(Scan::Missing);
        }
        if after != b"\r\n" {
            return Err("a multipart delimiter is not followed by CRLF");
        }
        at += 2;
        let rest = &body[at..];
        let window = &rest[..rest.len().min(MAX_PART_HEAD)];
        let Some(end) = memchr::memmem::find(window, b"\r\n\r\n") else {
            if rest.len() >= MAX_PART_HEAD {
                return Err("a multipart part's headers are too long");
            }
            return more("the body ends inside a multipart part's headers");
        };
        let (field, has_file) = disposition(&rest[..end])?;
        let value_at = at + end + 4;
        let rest = &body[value_at..];
        let wanted = field == Some(name) && !has_file;
        let found = memchr::memmem::find(rest, &delim);
        match (found, wanted) {
            (Some(len), true) if len <= MAX_VALUE => {
                return Ok(Scan::Found(value_at..value_at + len));
            }
            (Some(_), true) => return Err("the model field is too long"),
            // (a delimiter may start inside the value's last bytes and end past them)
            (None, true) if rest.len() >= MAX_VALUE + delim.len() => {
                return Err("the model field is too long")
            }
            (None, _) => return more("the body ends inside a multipart part"),
            (Some(len), false) => at = value_at + len + delim.len(),
        }
    }
    Ok(Scan::Missing)
}

/// The `name` of a part's `Content-Disposition: form-data` header and whether it names a
/// `filename` (a file part).
fn disposition(headers: &[u8]) -> Result<(Option<&[u8]>, bool), &'static str> {
    for line in headers.split(|&b| b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            return Err("a multipart part header has no ':'");
        };
        if !trim(&line[..colon]).eq_ignore_ascii_case(b"content-disposition") {
            continue;
        }
        let mut params = Params(&line[colon + 1..]);
        let kind = params.next_token();
        if !kind.eq_ignore_ascii_case(b"form-data") {
            return Err("a multipart part is not form-data");
        }
        let (mut name, mut file) = (None, false);
        while let Some((k, v)) = params.next_param()? {
            if k.eq_ignore_ascii_case(b"name") {
                name = Some(v);
            } else if k.eq_ignore_ascii_case(b"filename") || k.eq_ignore_ascii_case(b"filename*") {
                file = true;
            }
        }
        return Ok((name, file));
    }
    Err("a multipart part has no Content-Disposition")
}

/// One `key=value` parameter.
type Param<'a> = (&'a [u8], &'a [u8]);

/// `; key=value` parameters of a header value (values quoted or tokens).
struct Params<'a>(&'a [u8]);

impl<'a> Params<'a> {
    fn next_token(&mut self) -> &'a [u8] {
        let s = self.0;
        let end = s.iter().position(|&b| b == b';').unwrap_or(s.len());
        self.0 = &s[end..];
        trim(&s[..end])
    }

    fn next_param(&mut self) -> Result<Option<Param<'a>>, &'static str> {
        let s = trim(self.0);
        let Some(s) = s.strip_prefix(b";") else {
            return if s.is_empty() {
                Ok(None)
            } else {
                Err("a Content-Disposition parameter is malformed")
            };
        };
        let s = trim(s);
        let eq = s
            .iter()
            .position(|&b| b == b'=')
            .ok_or("a Content-Disposition parameter has no '='")?;
        let key = trim(&s[..eq]);
        let v = trim_start(&s[eq + 1..]);
        if let Some(q) = v.strip_prefix(b"\"") {
            // a quoted string; `\"` escapes are kept as they are (a model name has none)
            let mut i = 0;
            while i < q.len() {
                match q[i] {
                    b'\\' => i += 2,
                    b'"' => {
                        self.0 = &q[i + 1..];
                        return Ok(Some((key, &q[..i])));
                    }
                    _ => i += 1,
                }
            }
            Err("a Content-Disposition parameter has an unclosed quote")
        } else {
            let end = v.iter().position(|&b| b == b';').unwrap_or(v.len());
            self.0 = &v[end..];
            Ok(Some((key, trim(&v[..end]))))
        }
    }
}

fn trim(v: &[u8]) -> &[u8] {
    crate::http::head::trim(v)
}

fn trim_start(v: &[u8]) -> &[u8] {
    let n = v.iter().take_while(|b| matches!(b, b' ' | b'\t')).count();
    &v[n..]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A body as httpx (the openai SDK) writes it: text fields first, then the file.
    fn body(b: &str, fields: &[(&str, &str)], file: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        for (k, val) in fields {
            v.extend_from_slice(
                format!("--{b}\r\nContent-Disposition: form-data; name=\"{k}\"\r\n\r\n{val}\r\n")
                    .as_bytes(),
            );
        }
        v.extend_from_slice(format!("--{b}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\nContent-Type: audio/wav\r\n\r\n").as_bytes());
        v.extend_from_slice(file);
        v.extend_from_slice(format!("\r\n--{b}--\r\n").as_bytes());
        v
    }

    fn value(b: &[u8], r: Scan) -> &[u8] {
        match r {
            Scan::Found(r) => &b[r],
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn boundary_forms() {
        let ok = |ct: &str| boundary(ct.as_bytes()).map(|b| b.to_vec());
        assert_eq!(ok("multipart/form-data; boundary=abc").unwrap(), b"abc");
        assert_eq!(ok("Multipart/Form-Data;boundary=\"a b\"").unwrap(), b"a b");
        assert_eq!(
            ok("multipart/form-data; charset=utf-8; boundary=x-1").unwrap(),
            b"x-1"
        );
        assert!(ok("application/json").is_err());
        assert!(ok("multipart/form-data").is_err());
        assert!(ok("multipart/form-data; boundary=").is_err());
        assert!(ok(&format!("multipart/form-data; boundary={}", "a".repeat(71))).is_err());
        assert!(ok("multipart/form-data; boundary=a\rb").is_err());
    }

    #[test]
    fn finds_the_model_before_the_file() {
        let b = body(
            "bnd",
            &[("model", "whisper-1"), ("language", "en")],
            b"RIFF....",
        );
        let r = find_field(&b, b"bnd", b"model", true).unwrap();
        assert_eq!(value(&b, r), b"whisper-1");
        // later fields are found too, the file part is never read
        let r = find_field(&b, b"bnd", b"language", true).unwrap();
        assert_eq!(value(&b, r), b"en");
        assert_eq!(
            find_field(&b, b"bnd", b"prompt", true).unwrap(),
            Scan::Missing
        );
    }

    #[test]
    fn every_cut_of_the_prefix_asks_for_more_or_finds() {
        let b = body("bnd", &[("model", "m")], &[0u8; 100]);
        let full = find_field(&b, b"bnd", b"model", true).unwrap();
        for cut in 0..b.len() {
            match find_field(&b[..cut], b"bnd", b"model", false).unwrap() {
                Scan::More => {}
                found => assert_eq!(found, full, "cut {cut}"),
            }
        }
    }

    #[test]
    fn a_file_first_asks_for_more_until_its_end() {
        let mut b = body("q", &[], &[7u8; 5000]);
        b.truncate(b.len() - 8);
        b.extend_from_slice(
            b"\r\n--q\r\nContent-Disposition: form-data; name=model\r\n\r\nm2\r\n--q--",
        );
        assert_eq!(
            find_field(&b[..3000], b"q", b"model", false).unwrap(),
            Scan::More
        );
        let r = find_field(&b, b"q", b"model", true).unwrap();
        assert_eq!(value(&b, r), b"m2");
    }

    #[test]
    fn hostile_input_is_refused_or_bounded() {
        let bad = |b: &[u8]| find_field(b, b"x", b"model", true);
        assert!(bad(b"").is_err());
        assert!(bad(&[b'a'; MAX_PART_HEAD + 10]).is_err());
        assert!(bad(b"--x\r\nno colon here\r\n\r\nv\r\n--x--").is_err());
        assert!(bad(b"--x\r\nContent-Type: text/plain\r\n\r\nv\r\n--x--").is_err());
        assert!(
            bad(b"--x\r\nContent-Disposition: attachment; name=model\r\n\r\nv\r\n--x--").is_err()
        );
        assert!(
            bad(b"--x\r\nContent-Disposition: form-data; name=\"model\r\n\r\nv\r\n--x--").is_err()
        );
        assert!(bad(b"--xjunk").is_err());
        // headers that never end
        let mut h = b"--x\r\nContent-Disposition: form-data; name=model\r\nX: ".to_vec();
        h.extend(std::iter::repeat_n(b'a', MAX_PART_HEAD));
        assert!(bad(&h).is_err());
        // a value over the bound
        let long = body("x", &[("model", &"m".repeat(MAX_VALUE + 1))], b"");
        assert!(bad(&long).is_err());
        // a delimiter straddling the end of a prefix: More, then found in the whole body
        let edge = body("x", &[("model", &"m".repeat(MAX_VALUE - 2))], b"");
        let vstart = edge.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
        let cut = vstart + MAX_VALUE + 1;
        assert_eq!(
            find_field(&edge[..cut], b"x", b"model", false),
            Ok(Scan::More)
        );
        assert!(matches!(
            find_field(&edge, b"x", b"model", true),
            Ok(Scan::Found(_))
        ));
        let mut open = long.clone();
        open.truncate(200 + MAX_VALUE);
        assert!(find_field(&open, b"x", b"model", false).is_err());
        // many empty parts: the part bound, not a long loop
        let many =
            "--x\r\nContent-Disposition: form-data; name=a\r\n\r\n\r\n".repeat(MAX_PARTS + 5);
        let mut m = many.into_bytes();
        m.extend_from_slice(b"--x--");
        assert_eq!(bad(&m).unwrap(), Scan::Missing);
        // a file part named model is not the model
        let f = b"--x\r\nContent-Disposition: form-data; name=model; filename=a\r\n\r\nv\r\n--x--";
        assert_eq!(bad(f).unwrap(), Scan::Missing);
        // escaped quotes in a quoted name: kept, no match, no panic
        let q = b"--x\r\nContent-Disposition: form-data; name=\"mo\\\"del\"\r\n\r\nv\r\n--x--";
        assert_eq!(bad(q).unwrap(), Scan::Missing);
        let q = b"--x\r\nContent-Disposition: form-data; name=\"a\\\r\n\r\nv\r\n--x--";
        assert!(bad(q).is_err());
    }

    /// The fuzz target's invariant (`fuzz/fuzz_targets/multipart.rs`) over mutated bodies: a
    /// prefix answers `More` or what the whole body answers; a found value is in bounds.
    #[test]
    fn prefixes_never_contradict_the_whole_body() {
        let seeds = [
            body("b", &[("model", "whisper-1"), ("x", "y")], b"RIFF\r\n--b"),
            body("b", &[("purpose", "batch")], &[0u8; 300]),
            b"--b\r\nContent-Disposition: form-data; name=model\r\n\r\nm\r\n--b--".to_vec(),
        ];
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = |n: usize| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % n as u64) as usize
        };
        for round in 0..20_000 {
            let mut b = seeds[round % seeds.len()].clone();
            for _ in 0..=next(4) {
                let at = next(b.len() + 1);
                match next(4) {
                    0 if at < b.len() => b[at] = b"\r\n-\"=;b:"[next(8)],
                    1 if at < b.len() => {
                        b.remove(at);
                    }
                    2 => b.insert(at, b"\r\n--b"[next(5)]),
                    _ => b.truncate(at.max(1)),
                }
            }
            let whole = find_field(&b, b"b", b"model", true);
            if let Ok(Scan::Found(r)) = &whole {
                assert!(r.end <= b.len() && r.len() <= MAX_VALUE);
            }
            let cut = next(b.len() + 1);
            match find_field(&b[..cut], b"b", b"model", false) {
                Ok(Scan::More) => {}
                early => assert_eq!(
                    early,
                    whole,
                    "{:?} cut at {cut}",
                    String::from_utf8_lossy(&b)
                ),
            }
        }
    }

    #[test]
    fn preamble_is_skipped() {
        let mut b = b"preamble text\r\n".to_vec();
        b.extend(body("p", &[("model", "tts-1")], b""));
        let r = find_field(&b, b"p", b"model", true).unwrap();
        assert_eq!(value(&b, r), b"tts-1");
    }
}
