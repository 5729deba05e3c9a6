//! Faults the mock injects on purpose, so tests and benches can break an upstream: what a fault
//! is (parsed from `x-mock-fault: <fault>` or `ringgate mock --fault <fault>`), the per-process
//! plan (rules limited to a model or a path prefix, firing for a fraction of requests drawn from
//! a seeded PRNG), and the choice for one request (a valid header always wins over the plan).
//!
//! Fault syntax (the list `ringgate mock --help` and docs/commands.md give):
//! `429[:retry-after=N]` (JSON error + `Retry-After`, default 1 s), `500` / `502` (HTML body),
//! `503` and any other 4xx/5xx (JSON error in the dialect's shape; `:retry-after=N` adds the
//! header), `reset`, `close`, `garbage`, `stall`, `stall-mid-head`, `stall-mid-body`,
//! `cut-after=N`, `cut-close-after=N`, `error-after=N`, `malformed`, `slow-first-byte=MS`,
//! `short-length`, `bad-chunk`, `huge-header`, `huge-body`, `extra-bytes[=MS]`.
//!
//! Behind a gateway (which does not forward `x-mock-fault`), a request can still ask for one
//! fault: an upstream model named `mock-fault-<FAULT>`, `_` standing for `=` (e.g.
//! `mock-fault-529`, `mock-fault-error-after_2`), gets that fault, when no header asks
//! otherwise.
//!
//! Owns: the `Fault` vocabulary and the decision whether one fires. Must not: write bytes
//! (`inject` does) or read sockets.

use std::fmt;

use crate::util::rng::Rng;

/// The request header that asks for a fault on this one request.
pub const HEADER: &str = "x-mock-fault";

/// Delay before `extra-bytes` sends its bogus second response (so the gateway has already
/// taken the first one as complete).
pub const EXTRA_BYTES_DELAY_MS: u64 = 20;

/// One way to answer badly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// An error status with an error body: HTML for 500 and 502, the dialect's JSON error
    /// shape otherwise; `Retry-After: N` when set (429 defaults to 1).
    Status { code: u16, retry_after: Option<u32> },
    /// Reset the connection (SO_LINGER 0, then close): the peer sees RST, no bytes.
    Reset,
    /// Close the connection at once, no bytes.
    Close,
    /// Bytes that are not HTTP, then close.
    Garbage,
    /// Never send the response head (wait until the peer gives up).
    Stall,
    /// Send part of the response head, then wait.
    StallMidHead,
    /// Send the head and part of the body (the first SSE event), then wait.
    StallMidBody,
    /// Chunked SSE: N whole events, then half of the next one, then close without the last
    /// chunk. A non-stream answer: half of a Content-Length body, then close.
    CutAfter(u32),
    /// As `CutAfter`, but the body is close-delimited (no Content-Length, no chunking).
    CutCloseAfter(u32),
    /// SSE: N whole events, then the dialect's own in-stream error event (Anthropic
    /// `event: error` with `overloaded_error`; Chat a `{"error":…}` chunk then `[DONE]`, as
    /// vLLM sends; Responses `response.failed`; Gemini an error chunk), then a proper end.
    /// Non-stream answers are unaffected.
    ErrorAfter(u32),
    /// A well-framed 200 whose JSON is invalid (non-stream), or an SSE stream with one event
    /// whose data is invalid JSON (then the normal ending).
    Malformed,
    /// Wait this many milliseconds, then answer normally.
    SlowFirstByte(u64),
    /// Declare a Content-Length larger than the body, send the body, close.
    ShortLength,
    /// Chunked body with an invalid chunk-size line after the first chunk, then close.
    BadChunk,
    /// A complete answer whose head carries a 100 KiB header.
    HugeHeader,
    /// A 1 GiB answer generated on the fly (JSON padding, or SSE comment events before the
    /// normal events); never buffered.
    HugeBody,
    /// A complete answer, then after this many milliseconds a second, unrequested response on
    /// the same connection (which stays open).
    ExtraBytes(u64),
}

impl Fault {
    /// Parse one fault (see the module docs for the syntax).
    pub fn parse(s: &str) -> Result<Fault, String> {
        let s = s.trim();
        if s.as_bytes().first().is_some_and(u8::is_ascii_digit) {
            return parse_status(s);
        }
        let (name, arg) = match s.split_once('=') {
            Some((n, a)) => (n, Some(a)),
            None => (s, None),
        };
        let num = |what: &str| -> Result<u64, String> {
            arg.ok_or(format!("fault {name:?} needs ={what}"))?
                .parse::<u64>()
                .map_err(|_| format!("fault {name:?}: {what} must be a whole number"))
        };
        let plain = |f: Fault| match arg {
            None => Ok(f),
            Some(_) => Err(format!("fault {name:?} takes no value")),
        };
        match name {
            "reset" => plain(Fault::Reset),
            "close" => plain(Fault::Close),
            "garbage" => plain(Fault::Garbage),
            "stall" => plain(Fault::Stall),
            "stall-mid-head" => plain(Fault::StallMidHead),
            "stall-mid-body" => plain(Fault::StallMidBody),
            "malformed" => plain(Fault::Malformed),
            "short-length" => plain(Fault::ShortLength),
            "bad-chunk" => plain(Fault::BadChunk),
            "huge-header" => plain(Fault::HugeHeader),
            "huge-body" => plain(Fault::HugeBody),
            "cut-after" => Ok(Fault::CutAfter(count(num("N")?)?)),
            "cut-close-after" => Ok(Fault::CutCloseAfter(count(num("N")?)?)),
            "error-after" => Ok(Fault::ErrorAfter(count(num("N")?)?)),
            "slow-first-byte" => Ok(Fault::SlowFirstByte(num("MS")?)),
            "extra-bytes" => match arg {
                None => Ok(Fault::ExtraBytes(EXTRA_BYTES_DELAY_MS)),
                Some(_) => Ok(Fault::ExtraBytes(num("MS")?)),
            },
            _ => Err(format!(
                "unknown fault {s:?} (429[:retry-after=N], 500, 502, 503, reset, close, garbage, \
                 stall, stall-mid-head, stall-mid-body, cut-after=N, cut-close-after=N, \
                 error-after=N, malformed, slow-first-byte=MS, short-length, bad-chunk, huge-header, \
                 huge-body, extra-bytes[=MS])"
            )),
        }
    }
}

fn count(n: u64) -> Result<u32, String> {
    u32::try_from(n).map_err(|_| format!("event count {n} is too large"))
}

/// `CODE[:retry-after=N]`.
fn parse_status(s: &str) -> Result<Fault, String> {
    let (code, opts) = match s.split_once(':') {
        Some((c, o)) => (c, Some(o)),
        None => (s, None),
    };
    let code: u16 = code
        .parse()
        .ok()
        .filter(|c| (400..=599).contains(c))
        .ok_or(format!("fault status {code:?} must be 400..=599"))?;
    let mut retry_after = (code == 429).then_some(1);
    for opt in opts.into_iter().flat_map(|o| o.split(',')) {
        match opt.split_once('=') {
            Some(("retry-after", n)) => {
                retry_after = Some(
                    n.parse()
                        .map_err(|_| format!("retry-after {n:?} must be whole seconds"))?,
                );
            }
            _ => return Err(format!("unknown option {opt:?} for fault {code}")),
        }
    }
    Ok(Fault::Status { code, retry_after })
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::Status {
                code,
                retry_after: None,
            } => write!(f, "{code}"),
            Fault::Status {
                code,
                retry_after: Some(n),
            } => write!(f, "{code}:retry-after={n}"),
            Fault::Reset => f.write_str("reset"),
            Fault::Close => f.write_str("close"),
            Fault::Garbage => f.write_str("garbage"),
            Fault::Stall => f.write_str("stall"),
            Fault::StallMidHead => f.write_str("stall-mid-head"),
            Fault::StallMidBody => f.write_str("stall-mid-body"),
            Fault::CutAfter(n) => write!(f, "cut-after={n}"),
            Fault::CutCloseAfter(n) => write!(f, "cut-close-after={n}"),
            Fault::ErrorAfter(n) => write!(f, "error-after={n}"),
            Fault::Malformed => f.write_str("malformed"),
            Fault::SlowFirstByte(ms) => write!(f, "slow-first-byte={ms}"),
            Fault::ShortLength => f.write_str("short-length"),
            Fault::BadChunk => f.write_str("bad-chunk"),
            Fault::HugeHeader => f.write_str("huge-header"),
            Fault::HugeBody => f.write_str("huge-body"),
            Fault::ExtraBytes(ms) => write!(f, "extra-bytes={ms}"),
        }
    }
}

/// One per-process rule: when it matches a request, it fires for `rate` of them and then
/// injects one of `faults` (picked at random when there are several).
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    pub faults: Vec<Fault>,
    /// Fraction of matching requests that get a fault, 0.0..=1.0.
    pub rate: f64,
    /// Only requests for this model (the body's `model`, or the model in a Gemini / Azure
    /// path).
    pub model: Option<String>,
    /// Only requests whose path starts with this.
    pub path: Option<String>,
}

impl Rule {
    /// A rule that always injects `fault`.
    pub fn always(fault: Fault) -> Rule {
        Rule {
            faults: vec![fault],
            rate: 1.0,
            model: None,
            path: None,
        }
    }

    fn matches(&self, path: &[u8], model: Option<&str>) -> bool {
        let model_ok = match &self.model {
            None => true,
            Some(want) => model == Some(want.as_str()),
        };
        let path_ok = match &self.path {
            None => true,
            Some(p) => path.starts_with(p.as_bytes()),
        };
        model_ok && path_ok && !self.faults.is_empty()
    }
}

/// The per-process fault plan: rules tried in order (the first that matches decides), and the
/// PRNG seed. The default plan injects nothing.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Plan {
    pub rules: Vec<Rule>,
    pub seed: u64,
}

impl Plan {
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Whether any rule needs the request's model to decide.
    pub fn needs_model(&self) -> bool {
        self.rules.iter().any(|r| r.model.is_some())
    }

    /// The fault for a request without a fault header, if any.
    pub fn pick(&self, path: &[u8], model: Option<&str>, dice: &Dice) -> Option<Fault> {
        let rule = self.rules.iter().find(|r| r.matches(path, model))?;
        if rule.rate < 1.0 && dice.unit() >= rule.rate {
            return None;
        }
        let i = if rule.faults.len() == 1 {
            0
        } else {
            dice.below(rule.faults.len())
        };
        rule.faults.get(i).cloned()
    }
}

/// A shard's fault dice (the crate's one PRNG, SplitMix64): the same seed and request order
/// give the same faults.
#[derive(Debug)]
pub struct Dice(Rng);

impl Dice {
    /// Shard `shard`'s dice for plan seed `seed`.
    pub fn new(seed: u64, shard: usize) -> Dice {
        Dice(Rng::new(
            seed ^ (shard as u64).wrapping_mul(0xA24B_AED4_963E_E407),
        ))
    }

    /// Uniform in [0, 1).
    pub fn unit(&self) -> f64 {
        self.0.unit()
    }

    /// Uniform in 0..n (n > 0).
    pub fn below(&self, n: usize) -> usize {
        self.0.below(n)
    }
}

/// The model-name prefix that asks for a fault (see the module docs).
pub const MODEL_PREFIX: &str = "mock-fault-";

/// The fault an upstream model name asks for (`mock-fault-<FAULT>`, `_` standing for `=`,
/// which model names cannot carry: `mock-fault-error-after_2`), if it parses.
pub fn from_model(model: Option<&str>) -> Option<Fault> {
    let spec = model?.strip_prefix(MODEL_PREFIX)?.replace('_', "=");
    Fault::parse(&spec).ok()
}

/// The value of the `x-mock-fault` header in a raw request head, if present.
pub fn header_value(head: &[u8]) -> Option<&[u8]> {
    let name = HEADER.as_bytes();
    head.split(|&b| b == b'\n').skip(1).find_map(|line| {
        let colon = line.iter().position(|&b| b == b':')?;
        let (n, v) = line.split_at(colon);
        if !n.eq_ignore_ascii_case(name) {
            return None;
        }
        Some(crate::http::head::trim(&v[1..]))
    })
}

/// The fault a request asks for in its header. `Ok(None)`: no header.
pub fn from_header(head: &[u8]) -> Result<Option<Fault>, String> {
    match header_value(head) {
        None => Ok(None),
        Some(v) => {
            let s = std::str::from_utf8(v).map_err(|_| format!("{HEADER} is not UTF-8"))?;
            Fault::parse(s).map(Some)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_fault_and_prints_it_back() {
        let table: &[(&str, Fault)] = &[
            (
                "429",
                Fault::Status {
                    code: 429,
                    retry_after: Some(1),
                },
            ),
            (
                "429:retry-after=2",
                Fault::Status {
                    code: 429,
                    retry_after: Some(2),
                },
            ),
            (
                "500",
                Fault::Status {
                    code: 500,
                    retry_after: None,
                },
            ),
            (
                "503:retry-after=7",
                Fault::Status {
                    code: 503,
                    retry_after: Some(7),
                },
            ),
            ("reset", Fault::Reset),
            ("close", Fault::Close),
            ("garbage", Fault::Garbage),
            ("stall", Fault::Stall),
            ("stall-mid-head", Fault::StallMidHead),
            ("stall-mid-body", Fault::StallMidBody),
            ("cut-after=3", Fault::CutAfter(3)),
            ("cut-close-after=0", Fault::CutCloseAfter(0)),
            ("error-after=2", Fault::ErrorAfter(2)),
            ("malformed", Fault::Malformed),
            ("slow-first-byte=250", Fault::SlowFirstByte(250)),
            ("short-length", Fault::ShortLength),
            ("bad-chunk", Fault::BadChunk),
            ("huge-header", Fault::HugeHeader),
            ("huge-body", Fault::HugeBody),
            ("extra-bytes", Fault::ExtraBytes(EXTRA_BYTES_DELAY_MS)),
            ("extra-bytes=0", Fault::ExtraBytes(0)),
        ];
        assert_eq!(
            from_model(Some("mock-fault-error-after_2")),
            Some(Fault::ErrorAfter(2))
        );
        assert_eq!(
            from_model(Some("mock-fault-429:retry-after_3")),
            Some(Fault::Status {
                code: 429,
                retry_after: Some(3)
            })
        );
        assert_eq!(from_model(Some("gpt-4o")), None);
        for (text, want) in table {
            let got = Fault::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(&got, want, "{text}");
            assert_eq!(Fault::parse(&got.to_string()).unwrap(), got, "{text}");
        }
        assert_eq!(Fault::parse(" 502 ").unwrap().to_string(), "502");
    }

    #[test]
    fn rejects_bad_faults() {
        for bad in [
            "",
            "nope",
            "200",
            "600",
            "99",
            "429:retry-after=x",
            "429:wait=1",
            "cut-after",
            "cut-after=x",
            "cut-after=-1",
            "cut-after=99999999999",
            "slow-first-byte",
            "reset=1",
            "extra-bytes=soon",
        ] {
            assert!(Fault::parse(bad).is_err(), "{bad:?} should not parse");
        }
    }

    #[test]
    fn header_is_found_case_insensitively() {
        let head = b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nX-Mock-Fault:  cut-after=2 \r\n\r\n";
        assert_eq!(header_value(head), Some(&b"cut-after=2"[..]));
        assert_eq!(from_header(head).unwrap(), Some(Fault::CutAfter(2)));
        let head = b"POST / HTTP/1.1\r\nx-mock-faults: 500\r\n\r\n";
        assert_eq!(from_header(head).unwrap(), None);
        assert!(from_header(b"POST / HTTP/1.1\r\nx-mock-fault: boom\r\n\r\n").is_err());
    }

    #[test]
    fn rules_filter_by_model_and_path() {
        let plan = Plan {
            rules: vec![Rule {
                model: Some("gpt-x".into()),
                path: Some("/v1/chat".into()),
                ..Rule::always(Fault::Reset)
            }],
            seed: 1,
        };
        let d = Dice::new(1, 0);
        assert!(plan.needs_model());
        assert_eq!(
            plan.pick(b"/v1/chat/completions", Some("gpt-x"), &d),
            Some(Fault::Reset)
        );
        assert_eq!(plan.pick(b"/v1/chat/completions", Some("gpt-y"), &d), None);
        assert_eq!(plan.pick(b"/v1/chat/completions", None, &d), None);
        assert_eq!(plan.pick(b"/v1/messages", Some("gpt-x"), &d), None);
        assert_eq!(Plan::default().pick(b"/", None, &d), None);
    }

    #[test]
    fn rate_is_a_fraction_and_seeded() {
        let plan = Plan {
            rules: vec![Rule {
                faults: vec![Fault::Close, Fault::Reset],
                rate: 0.3,
                model: None,
                path: None,
            }],
            seed: 42,
        };
        let run = |seed| {
            let d = Dice::new(seed, 0);
            (0..10_000)
                .map(|_| plan.pick(b"/", None, &d))
                .collect::<Vec<_>>()
        };
        let a = run(42);
        assert_eq!(a, run(42), "same seed, same faults");
        assert_ne!(a, run(43));
        let hit = a.iter().filter(|f| f.is_some()).count();
        assert!((2_700..3_300).contains(&hit), "{hit} of 10000 at rate 0.3");
        let resets = a.iter().filter(|f| **f == Some(Fault::Reset)).count();
        assert!(
            (hit * 2 / 5..hit * 3 / 5).contains(&resets),
            "{resets} of {hit}"
        );
    }
}
