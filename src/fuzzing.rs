//! Entry points for the fuzz targets in `fuzz/` (cargo-fuzz), and nothing else.
//!
//! Owns: thin, pure wrappers that make crate-private parsers reachable from outside the crate
//! without widening their visibility in the modules that own them. Must not: contain parsing
//! logic of its own, do IO, or be used by the gateway (it is `#[doc(hidden)]` and unstable).

use crate::error::Error;
use crate::upstream::ResponseHead;

/// The upstream response-head parser (`upstream::exchange`): `Ok(None)` means "need more
/// bytes"; `Ok(Some((head, len)))` gives the head and the bytes it took (interim 1xx responses
/// included).
pub fn parse_response_head(buf: &[u8]) -> Result<Option<(ResponseHead, usize)>, Error> {
    crate::upstream::exchange::parse_response_head(buf)
}

thread_local! {
    /// Every built-in detector plus a custom pattern and words, compiled once per thread.
    static GUARDS: Vec<std::rc::Rc<crate::guardrail::Guard>> = fuzz_guards();
}

fn fuzz_guards() -> Vec<std::rc::Rc<crate::guardrail::Guard>> {
    let text = "[[guardrail]]\nname = \"pii\"\ndetect = [\"email\", \"phone\", \"credit_card\", \"iban\", \"us_ssn\", \"ipv4\"]\naction = \"mask\"\n\n[[guardrail]]\nname = \"s\"\ndetect = [\"secrets\"]\naction = \"mask\"\nwords = [\"codename-x\", \"ab\"]\npatterns = ['(?i)\\bproject\\s{1,4}falcon\\b', '(a|aa){1,16}b']\n";
    crate::config::Config::parse(text)
        .map(|c| {
            c.guardrails
                .iter()
                .filter_map(|g| crate::guardrail::Guard::compile(g).ok())
                .map(std::rc::Rc::new)
                .collect()
        })
        .unwrap_or_default()
}

/// The streaming masker over `text` cut at `cuts` against masking it whole, under the
/// built-in detectors (see `guardrail::scan`): (streamed, whole, most bytes held after a piece,
/// the hold-back bound).
pub fn guardrail_stream_vs_whole(text: &str, cuts: &[usize]) -> (String, String, usize, usize) {
    GUARDS.with(|g| crate::guardrail::chain::stream_vs_whole(g, text, cuts))
}
