//! Strict JSON validation without building anything: `check` says whether bytes are exactly
//! one JSON value (RFC 8259: strings with legal escapes and no raw control characters, numbers
//! in JSON's grammar, the three literals, UTF-8, only whitespace around the value), nested at
//! most `nesting::MAX_DEPTH` deep.
//!
//! Why its own: `vet` checks every relayed non-stream answer and every SSE event's data. Going
//! through sonic-rs (`from_slice::<IgnoredAny>` after `nesting::check`) cost ~3,200
//! instructions for a 200-byte chat chunk — a padded copy of the input, serde dispatch, a
//! second pass for the depth bound — the bulk of a relayed stream's per-event cost. This is one
//! flat pass (no recursion, no allocation; strings skipped eight bytes at a time, a short one's
//! first word tested inline), the depth bound included, and agrees with serde_json on what is
//! valid (tested on generated documents).
//!
//! Owns: the grammar check. Must not: allocate, recurse, or say more about an error than where
//! it is (the reason is logged; no input bytes go into it).

use crate::util::nesting::MAX_DEPTH;

/// Why bytes are not one JSON value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Invalid {
    /// The input ends inside the value (or is empty).
    Eof,
    /// A byte that cannot be there, at this offset.
    At(usize),
    /// Arrays/objects nested deeper than `MAX_DEPTH`.
    TooDeep,
}

/// Whether `b` is exactly one JSON value (surrounding whitespace allowed).
pub fn check(b: &[u8]) -> Result<(), Invalid> {
    // Non-ASCII bytes are legal only inside strings, and there they must be UTF-8: `string`
    // checks each such character where it meets it (no separate pass over the whole input);
    // anywhere else the grammar refuses them.
    let mut depth = 0usize;
    // Bit `d` set: the container at depth `d + 1` is an object; `object`: the innermost open
    // container is one (kept beside the bits so the step after each value reads a flag, not
    // a 128-bit shift: that was ~160 instructions of a 200-byte chat chunk).
    let mut objects = 0u128;
    let mut object = false;
    let mut i = ws(b, 0);
    'value: loop {
        // A value starts at `i`.
        match b.get(i) {
            None => return Err(Invalid::Eof),
            Some(&open @ (b'{' | b'[')) => {
                if depth >= MAX_DEPTH {
                    return Err(Invalid::TooDeep);
                }
                let bit = 1u128 << depth;
                i = ws(b, i + 1);
                if open == b'{' {
                    match b.get(i) {
                        Some(b'}') => i += 1,
                        _ => {
                            objects |= bit;
                            (depth, object) = (depth + 1, true);
                            i = member_key(b, i)?;
                            continue 'value;
                        }
                    }
                } else {
                    match b.get(i) {
                        Some(b']') => i += 1,
                        _ => {
                            objects &= !bit;
                            (depth, object) = (depth + 1, false);
                            continue 'value;
                        }
                    }
                }
            }
            Some(b'"') => i = string(b, i + 1)?,
            Some(b't') => i = literal(b, i, b"true")?,
            Some(b'f') => i = literal(b, i, b"false")?,
            Some(b'n') => i = literal(b, i, b"null")?,
            Some(b'-' | b'0'..=b'9') => i = number(b, i)?,
            Some(_) => return Err(Invalid::At(i)),
        }
        // After a value: close containers, or a comma and the next value.
        loop {
            i = ws(b, i);
            if depth == 0 {
                return if i == b.len() {
                    Ok(())
                } else {
                    Err(Invalid::At(i))
                };
            }
            match b.get(i) {
                None => return Err(Invalid::Eof),
                Some(b',') => {
                    i = ws(b, i + 1);
                    if object {
                        i = member_key(b, i)?;
                    }
                    continue 'value;
                }
                Some(&close @ (b'}' | b']')) if object == (close == b'}') => {
                    i += 1;
                    depth -= 1;
                    object = depth > 0 && objects & (1u128 << (depth - 1)) != 0;
                }
                Some(_) => return Err(Invalid::At(i)),
            }
        }
    }
}

/// Skip whitespace from `i`: one comparison when there is none (compact JSON, the common
/// case), else the loop (`ws_run`).
#[inline(always)]
fn ws(b: &[u8], i: usize) -> usize {
    match b.get(i) {
        Some(&c) if c > b' ' => i,
        _ => ws_run(b, i),
    }
}

#[inline]
fn ws_run(b: &[u8], mut i: usize) -> usize {
    while let Some(b' ' | b'\t' | b'\n' | b'\r') = b.get(i) {
        i += 1;
    }
    i
}

/// An object member's `"key" :` at `i`; returns where its value starts.
#[inline]
fn member_key(b: &[u8], i: usize) -> Result<usize, Invalid> {
    match b.get(i) {
        Some(b'"') => {}
        None => return Err(Invalid::Eof),
        Some(_) => return Err(Invalid::At(i)),
    }
    let i = ws(b, string(b, i + 1)?);
    match b.get(i) {
        Some(b':') => Ok(ws(b, i + 1)),
        None => Err(Invalid::Eof),
        Some(_) => Err(Invalid::At(i)),
    }
}

/// The rest of a string whose opening quote is just before `i`; returns the offset after its
/// closing quote. A string whose closing quote is in its first eight bytes with nothing
/// special before it (most keys and tokens) is done here, inline, by one word test; any other
/// goes on in `string_rest`.
#[inline(always)]
fn string(b: &[u8], i: usize) -> Result<usize, Invalid> {
    let Some(word) = b.get(i..i + 8).and_then(|s| <[u8; 8]>::try_from(s).ok()) else {
        return string_rest(b, i);
    };
    let x = u64::from_le_bytes(word);
    let m = special(x) | (x & HIGH);
    if m == 0 {
        return string_rest(b, i + 8);
    }
    let at = i + (m.trailing_zeros() / 8) as usize;
    match b.get(at) {
        Some(b'"') => Ok(at + 1),
        _ => string_rest(b, at),
    }
}

/// The rest of a string from `i` (inside it, after plain bytes): plain ASCII bytes are skipped
/// eight at a time (`special`, plus the high bit: a non-ASCII byte stops the skip and its
/// character is checked, `utf8_char`); once a run of plain bytes is `LONG_RUN` long (a
/// prompt, not a key or a token), `BLOCK` bytes a step (`plain`), the same one pass.
#[inline(never)]
fn string_rest(b: &[u8], mut i: usize) -> Result<usize, Invalid> {
    loop {
        let start = i;
        while let Some(chunk) = b.get(i..i + 8) {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            let m = special(u64::from_le_bytes(word)) | (u64::from_le_bytes(word) & HIGH);
            if m != 0 {
                i += (m.trailing_zeros() / 8) as usize;
                break;
            }
            i += 8;
            if i - start >= LONG_RUN {
                while let Some(block) = b.get(i..i + BLOCK).and_then(|s| s.try_into().ok()) {
                    if !plain(block) {
                        break;
                    }
                    i += BLOCK;
                }
            }
        }
        match b.get(i) {
            None => return Err(Invalid::Eof),
            Some(b'"') => return Ok(i + 1),
            Some(b'\\') => {}
            Some(&c) if c < 0x20 => return Err(Invalid::At(i)),
            Some(&c) if c >= 0x80 => {
                i = utf8_char(b, i, c)?;
                continue;
            }
            Some(_) => {
                i += 1;
                continue;
            }
        }
        // An escape.
        match b.get(i + 1) {
            None => return Err(Invalid::Eof),
            Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => i += 2,
            Some(b'u') => {
                for k in i + 2..i + 6 {
                    match b.get(k) {
                        None => return Err(Invalid::Eof),
                        Some(c) if c.is_ascii_hexdigit() => {}
                        Some(_) => return Err(Invalid::At(k)),
                    }
                }
                i += 6;
            }
            Some(_) => return Err(Invalid::At(i + 1)),
        }
    }
}

/// One UTF-8 encoded character at `i` (lead byte `lead` ≥ 0x80), exactly as `str::from_utf8`
/// judges it (no overlongs, surrogates or code points past U+10FFFF); returns the offset after
/// it. Cut off by the end of the input: `Eof`.
#[inline]
fn utf8_char(b: &[u8], i: usize, lead: u8) -> Result<usize, Invalid> {
    let width = match lead {
        0xC2..=0xDF => 2,
        0xE0..=0xEF => 3,
        0xF0..=0xF4 => 4,
        _ => return Err(Invalid::At(i)),
    };
    let end = (i + width).min(b.len());
    match std::str::from_utf8(b.get(i..end).unwrap_or_default()) {
        Ok(_) if end == i + width => Ok(end),
        Ok(_) => Err(Invalid::Eof),
        Err(e) if e.error_len().is_none() => Err(Invalid::Eof),
        Err(_) => Err(Invalid::At(i)),
    }
}

/// Plain bytes a string has run before `string` switches to `BLOCK`-byte steps.
const LONG_RUN: usize = 24;

/// Bytes `plain` checks at once.
const BLOCK: usize = 32;

/// Whether `block` holds no quote, backslash, control or non-ASCII byte. Written without an
/// early exit so the compiler checks the block in vector registers (SSE2: about one
/// instruction a byte, against two to three for the word step); which byte stopped it is found
/// by the word step after.
#[inline]
fn plain(block: &[u8; BLOCK]) -> bool {
    let mut hit = 0u8;
    for &c in block {
        hit |=
            u8::from(c == b'"') | u8::from(c == b'\\') | u8::from(c < 0x20) | u8::from(c >= 0x80);
    }
    hit == 0
}

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGH: u64 = 0x8080_8080_8080_8080;

/// A mask whose lowest set bit is the high bit of the first byte of `x` (little-endian) that is
/// a quote, a backslash or a control byte (< 0x20); 0 if there is none. (Bits above the first
/// hit may be false positives from borrows; only the lowest one is used.)
#[inline]
fn special(x: u64) -> u64 {
    let zero = |v: u64| v.wrapping_sub(ONES) & !v;
    let quote = zero(x ^ (ONES * u64::from(b'"')));
    let backslash = zero(x ^ (ONES * u64::from(b'\\')));
    let control = x.wrapping_sub(ONES * 0x20) & !x;
    (quote | backslash | control) & HIGH
}

/// `true`, `false` or `null` at `i`.
fn literal(b: &[u8], i: usize, word: &[u8]) -> Result<usize, Invalid> {
    let end = i + word.len();
    match b.get(i..end) {
        Some(s) if s == word => Ok(end),
        _ => {
            // Where it goes wrong: a prefix that runs out is an early end.
            let have = b.get(i..).unwrap_or_default();
            let same = have.iter().zip(word).take_while(|(x, y)| x == y).count();
            if same == have.len() {
                Err(Invalid::Eof)
            } else {
                Err(Invalid::At(i + same))
            }
        }
    }
}

/// A number at `i`: `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`.
fn number(b: &[u8], mut i: usize) -> Result<usize, Invalid> {
    let digits = |b: &[u8], i: usize| -> Result<usize, Invalid> {
        let n = b
            .get(i..)
            .unwrap_or_default()
            .iter()
            .take_while(|c| c.is_ascii_digit())
            .count();
        match n {
            0 if i >= b.len() => Err(Invalid::Eof),
            0 => Err(Invalid::At(i)),
            _ => Ok(i + n),
        }
    };
    if b.get(i) == Some(&b'-') {
        i += 1;
    }
    match b.get(i) {
        Some(b'0') => i += 1,
        Some(b'1'..=b'9') => i = digits(b, i)?,
        None => return Err(Invalid::Eof),
        Some(_) => return Err(Invalid::At(i)),
    }
    if b.get(i) == Some(&b'.') {
        i = digits(b, i + 1)?;
    }
    if let Some(b'e' | b'E') = b.get(i) {
        i += 1;
        if let Some(b'+' | b'-') = b.get(i) {
            i += 1;
        }
        i = digits(b, i)?;
    }
    Ok(i)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The oracle: serde_json (its own recursion limit is 128 too), on UTF-8 input only —
    /// skipping a string into `IgnoredAny` does not check its UTF-8, JSON text must be UTF-8.
    fn serde_ok(b: &[u8]) -> bool {
        std::str::from_utf8(b).is_ok() && serde_json::from_slice::<serde::de::IgnoredAny>(b).is_ok()
    }

    #[test]
    fn cases() {
        for ok in [
            &br#"{"a":[1,2,{"b":"\"}"}]}"#[..],
            b" [] \n",
            b"1",
            b"-0.5e+10",
            b"\"x\"",
            b"\"\\u00e9\\n\\/\"",
            b"{\"\xc3\xa9\":true,\"b\":false,\"c\":null}",
            b"[[],{},\"\",0,-1,1E5,2.25e-3]",
            b"{ \"a\" : [ 1 , 2 ] }",
            // the innermost container's kind after empty and nested ones close
            b"{\"a\":[],\"b\":{},\"c\":[{}],\"d\":{\"e\":[[]]},\"f\":1}",
            b"[[[]],{\"a\":{}},[],{},[{\"b\":[]}],2]",
        ] {
            assert_eq!(check(ok), Ok(()), "{}", String::from_utf8_lossy(ok));
            assert!(serde_ok(ok));
        }
        let bad: &[(&[u8], Invalid)] = &[
            (b"", Invalid::Eof),
            (b"  ", Invalid::Eof),
            (br#"{"id":"c1","choices":[{"mess"#, Invalid::Eof),
            (b"<html>", Invalid::At(0)),
            (br#"{"a":tru}"#, Invalid::At(8)),
            (br#"{"a":tru"#, Invalid::Eof),
            (br#"{"a":1} {"b":2}"#, Invalid::At(8)),
            (b"{\"a\":\"\xff\"}", Invalid::At(6)),
            (b"[01]", Invalid::At(2)),
            (b"[1.]", Invalid::At(3)),
            (b"[.5]", Invalid::At(1)),
            (b"[1e]", Invalid::At(3)),
            (b"[-]", Invalid::At(2)),
            (b"[1,]", Invalid::At(3)),
            (b"{\"a\":1,}", Invalid::At(7)),
            (b"{\"a\" 1}", Invalid::At(5)),
            (b"{1:2}", Invalid::At(1)),
            (b"[1}", Invalid::At(2)),
            (b"\"a\tb\"", Invalid::At(2)),
            (b"\"\\x\"", Invalid::At(2)),
            (b"\"\\u12g4\"", Invalid::At(5)),
            (b"\"\\u12", Invalid::Eof),
            (b"[1", Invalid::Eof),
            (b"{\"a\":[]]", Invalid::At(7)),
            (b"[{}}", Invalid::At(3)),
            (b"{\"a\":{}]", Invalid::At(7)),
            (b"[{\"a\":[{}]]", Invalid::At(10)),
            (b"{\"a\":[{}],\"b\"}", Invalid::At(13)),
        ];
        for &(b, want) in bad {
            assert_eq!(check(b), Err(want), "{}", String::from_utf8_lossy(b));
            assert!(!serde_ok(b), "{}", String::from_utf8_lossy(b));
        }
        let deep = format!("{}{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
        assert_eq!(check(deep.as_bytes()), Ok(()));
        let deeper = format!("{}{}", "[".repeat(MAX_DEPTH + 1), "]".repeat(MAX_DEPTH + 1));
        assert_eq!(check(deeper.as_bytes()), Err(Invalid::TooDeep));
        // The eight-at-a-time skip: a special byte at every offset of strings of every length.
        for len in 0..24 {
            for at in 0..len {
                for (byte, ok) in [
                    (b'\t', false),
                    (0x1f, false),
                    (b'"', false),
                    (b'\\', false),
                    (0x7f, true),
                    (b' ', true),
                ] {
                    let mut doc = vec![b'"'];
                    doc.extend(std::iter::repeat_n(b'a', len));
                    doc[1 + at] = byte;
                    doc.push(b'"');
                    assert_eq!(check(&doc).is_ok(), ok, "{doc:?}");
                    assert_eq!(check(&doc).is_ok(), serde_ok(&doc), "{doc:?}");
                }
            }
        }
        // UTF-8 is checked inside strings only where the skip stops: valid and invalid
        // characters (overlong, surrogate, past U+10FFFF, stray continuation, cut short) at
        // every offset of strings of several lengths, and outside strings.
        let chars: &[&[u8]] = &[
            b"\xc3\xa9",
            b"\xe2\x82\xac",
            b"\xf0\x9f\x98\x80",
            b"\xf4\x8f\xbf\xbf",
            b"\xc0\x80",
            b"\xc1\xbf",
            b"\xe0\x80\x80",
            b"\xed\xa0\x80",
            b"\xf4\x90\x80\x80",
            b"\xf5\x80\x80\x80",
            b"\x80",
            b"\xbf",
            b"\xc3",
            b"\xe2\x82",
            b"\xff",
        ];
        for ch in chars {
            for len in 0..12 {
                for at in 0..=len {
                    let mut doc = vec![b'"'];
                    doc.extend(std::iter::repeat_n(b'a', len));
                    doc.splice(1 + at..1 + at, ch.iter().copied());
                    doc.push(b'"');
                    assert_eq!(check(&doc).is_ok(), serde_ok(&doc), "{doc:?}");
                    // cut inside the character: an early end
                    let cut = &doc[..1 + at + ch.len() - 1];
                    assert!(check(cut).is_err(), "{cut:?}");
                }
            }
            let outside = [b"[".as_slice(), ch, b"]"].concat();
            assert!(check(&outside).is_err(), "{outside:?}");
        }
        assert_eq!(check(b"\"\xc3"), Err(Invalid::Eof));
        assert_eq!(check(b"\"\xc3(\""), Err(Invalid::At(1)));
        // Deep input that is not even well formed stops at the bound, without recursion.
        assert_eq!(
            check("[{\"a\":".repeat(100_000).as_bytes()),
            Err(Invalid::TooDeep)
        );
    }

    /// Long strings (past the eight-byte skip, into and past the `BLOCK` steps): one odd byte
    /// or escape at every offset of a 100-byte string agrees with serde_json, and a bad byte
    /// is found where it is.
    #[test]
    fn long_strings_agree_with_serde_json() {
        let odd: &[&[u8]] = &[
            b"\x01",
            b"\x1f",
            b"\x7f",
            b"\\n",
            b"\\u00e9",
            b"\\x",
            b"\\u12",
            "\u{e9}".as_bytes(),
            "\u{1F600}".as_bytes(),
            b"\xc3",
            b"\xff",
            b"\xed\xa0\x80",
            b"\"",
            b"\\",
        ];
        const LEN: usize = 100;
        for piece in odd {
            for at in 0..=LEN {
                let mut doc = b"[\"".to_vec();
                doc.extend(std::iter::repeat_n(b'a', at));
                doc.extend_from_slice(piece);
                doc.extend(std::iter::repeat_n(b'b', LEN - at));
                doc.extend_from_slice(b"\"]");
                let ok = check(&doc).is_ok();
                assert_eq!(ok, serde_ok(&doc), "{:?}", String::from_utf8_lossy(&doc));
                if let (Err(Invalid::At(i)), Some(&c)) = (check(&doc), piece.first()) {
                    if !(0x20..0x80).contains(&c) {
                        assert_eq!(i, 2 + at, "{:?}", String::from_utf8_lossy(&doc));
                    }
                }
                // cut short anywhere inside: never valid
                for cut in 1..doc.len() {
                    assert!(check(&doc[..cut]).is_err());
                }
            }
        }
    }

    /// Agreement with serde_json on every document made of a small alphabet of JSON pieces
    /// (all sequences up to a length), and on every prefix and single-byte corruption of a
    /// realistic chat chunk.
    #[test]
    fn agrees_with_serde_json() {
        let pieces: &[&[u8]] = &[
            b"{", b"}", b"[", b"]", b"\"", b":", b",", b"1", b"-", b".", b"e", b"0", b"\\", b"u",
            b" ", b"n", b"ull", b"a",
        ];
        let mut n = 0;
        for len in 1..=5u32 {
            for code in 0..pieces.len().pow(len) {
                let (mut c, mut doc) = (code, Vec::new());
                for _ in 0..len {
                    doc.extend_from_slice(pieces[c % pieces.len()]);
                    c /= pieces.len();
                }
                assert_eq!(
                    check(&doc).is_ok(),
                    serde_ok(&doc),
                    "{}",
                    String::from_utf8_lossy(&doc)
                );
                n += 1;
            }
        }
        assert!(n > 1_000_000);
        let chunk = br#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1733000000,"model":"gpt-4o-mini","choices":[{"index":0,"delta":{"content":"h\u00e9llo \"w\"\n"},"logprobs":null,"finish_reason":null}],"usage":{"t":-1.5e-3}}"#;
        assert_eq!(check(chunk), Ok(()));
        for k in 0..chunk.len() {
            assert_eq!(
                check(&chunk[..k]).is_ok(),
                serde_ok(&chunk[..k]),
                "prefix {k}"
            );
            for byte in [b'"', b'\\', b'{', b']', b'x', b'0', b'\n', 0x01, 0xc3] {
                let mut doc = chunk.to_vec();
                doc[k] = byte;
                assert_eq!(
                    check(&doc).is_ok(),
                    serde_ok(&doc),
                    "{}",
                    String::from_utf8_lossy(&doc)
                );
            }
        }
    }
}
