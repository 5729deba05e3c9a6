//! A small, bounded reader of the Prometheus text format (0.0.4), for the handful of series
//! an engine's load signal needs. Not a general parser: it finds samples of the wanted metric
//! names and folds their values (several label sets of one name — data-parallel engines, more
//! than one model — are summed or maxed), and ignores everything else.
//!
//! Bounds: at most `MAX_PAGE` bytes are looked at, lines longer than `MAX_LINE` are skipped
//! whole, at most `MAX_LINES` lines are read. Values: decimal/exponent floats, `NaN`, `+Inf`,
//! `-Inf` (Prometheus' spellings); a sample with an unparsable or non-finite value, or an
//! unclosed label set, counts as absent. An optional timestamp after the value is ignored.
//! Every series read is a count or a fraction: a negative sample poisons its name's fold (the
//! result stays negative whatever else is on the page), so the caller can refuse the page.
//!
//! Owns: `scan`, `Fold`. Must not: allocate per line or panic on any input (fuzzed:
//! fuzz/fuzz_targets/prom.rs).

/// Bytes of a page looked at (the poller reads no more).
pub const MAX_PAGE: usize = 1 << 20;
/// Longer lines are skipped.
pub const MAX_LINE: usize = 4096;
/// Lines read at most.
pub const MAX_LINES: usize = 50_000;

/// How several samples of one name combine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fold {
    Sum,
    Max,
}

/// Values of `wanted[i]` (name, fold) in `page`; `None` where no valid sample was found.
pub fn scan<const N: usize>(page: &[u8], wanted: &[(&str, Fold); N]) -> [Option<f64>; N] {
    let mut out: [Option<f64>; N] = [None; N];
    let page = &page[..page.len().min(MAX_PAGE)];
    for line in page.split(|&b| b == b'\n').take(MAX_LINES) {
        if line.len() > MAX_LINE {
            continue;
        }
        let line = trim(line);
        if line.is_empty() || line[0] == b'#' {
            continue;
        }
        let name_end = line
            .iter()
            .position(|&b| b == b'{' || b == b' ' || b == b'\t')
            .unwrap_or(line.len());
        let name = &line[..name_end];
        let Some(i) = wanted.iter().position(|(w, _)| w.as_bytes() == name) else {
            continue;
        };
        let Some(v) = value(&line[name_end..]) else {
            continue;
        };
        out[i] = Some(match (out[i], wanted[i].1) {
            (None, _) => v,
            (Some(a), _) if a < 0.0 || v < 0.0 => a.min(v),
            (Some(a), Fold::Sum) => a + v,
            (Some(a), Fold::Max) => a.max(v),
        });
    }
    out
}

fn trim(mut l: &[u8]) -> &[u8] {
    while let [b' ' | b'\t' | b'\r', rest @ ..] = l {
        l = rest;
    }
    while let [rest @ .., b' ' | b'\t' | b'\r'] = l {
        l = rest;
    }
    l
}

/// The sample value after the name: skip a `{...}` label set (quoted values may hold `}` and
/// escaped quotes), then the first whitespace-separated token.
fn value(rest: &[u8]) -> Option<f64> {
    let mut rest = rest;
    if rest.first() == Some(&b'{') {
        let mut quoted = false;
        let mut escaped = false;
        let mut end = None;
        for (i, &b) in rest.iter().enumerate().skip(1) {
            if escaped {
                escaped = false;
            } else if quoted && b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                quoted = !quoted;
            } else if !quoted && b == b'}' {
                end = Some(i);
                break;
            }
        }
        rest = &rest[end? + 1..];
    }
    let rest = trim(rest);
    let tok_end = rest
        .iter()
        .position(|&b| b == b' ' || b == b'\t')
        .unwrap_or(rest.len());
    let tok = std::str::from_utf8(&rest[..tok_end]).ok()?;
    let v: f64 = match tok {
        "NaN" | "+Inf" | "-Inf" | "Inf" => return None,
        t => t.parse().ok()?,
    };
    v.is_finite().then_some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: [(&str, Fold); 3] = [("a", Fold::Sum), ("b:c", Fold::Max), ("d", Fold::Sum)];

    #[test]
    fn finds_folds_and_skips() {
        let page = b"# HELP a x\n# TYPE a gauge\na{model_name=\"m}\\\"x\",engine=\"0\"} 2.0\na{engine=\"1\"} 3e0 1700000000\nab 9\nb:c 0.5\nb:c{} 0.25\r\nd NaN\n";
        assert_eq!(scan(page, &W), [Some(5.0), Some(0.5), None]);
        // a negative sample poisons the fold, whatever its order
        for page in [
            &b"a 3\na -1\na 5\nb:c 0.5\nb:c -0.1\n"[..],
            b"a -1\na 9\nb:c -0.1\nb:c 0.9\n",
        ] {
            let [a, b, _] = scan(page, &W);
            assert!(a.unwrap() < 0.0 && b.unwrap() < 0.0, "{a:?} {b:?}");
        }
    }

    #[test]
    fn malformed_lines_count_as_absent() {
        for page in [
            &b"a{engine=\"0\" 2.0\n"[..],
            b"a\n",
            b"a{} \n",
            b"a{} two\n",
            b"a{} +Inf\n",
            b"\xff\xfe{} 1\n",
        ] {
            assert_eq!(
                scan(page, &W)[0],
                None,
                "{:?}",
                String::from_utf8_lossy(page)
            );
        }
        let long = format!("a{{x=\"{}\"}} 1\na 2\n", "y".repeat(MAX_LINE));
        assert_eq!(scan(long.as_bytes(), &W)[0], Some(2.0));
    }
}
