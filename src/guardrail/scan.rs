//! One guardrail's compiled detectors (`Scanner`) and the incremental scan of one text
//! (`Tail`): text goes in piece by piece, and out comes, at once, every byte that can no
//! longer be part of a match — matches replaced, passed or refused per the guardrail's action.
//!
//! Why streaming equals whole-text masking: every pattern has a longest match (`hold`, from
//! the pattern's syntax; unbounded patterns are refused by the config). A position whose text
//! so far already rules out any match starting there is *dead*: an anchored lazy DFA of all
//! patterns (match kind "all", so no alternative is pruned) walks from it to the end of what
//! arrived and dies. Matches starting at dead positions are decided by the bytes present
//! (their ends and one byte of look-ahead are inside), so the leftmost match found now is the
//! one the whole text has; text is released up to the first live position (and never more
//! than `hold` bytes are held: a position `hold` bytes back cannot start anything longer).
//! The checks (Luhn, mod 97) look at a candidate's own bytes only. At the end of the text
//! (`last`) everything is decided.
//!
//! Owns: `Scanner`, `Tail`, the release rule above. Must not: allocate per byte, or keep more
//! than `hold` bytes of a text back (plus the one character before them, look-behind context).

use std::cell::RefCell;

use aho_corasick::{AhoCorasick, AhoCorasickKind, MatchKind as AcKind};
use regex_automata::hybrid::dfa::{Cache, DFA};
use regex_automata::{Anchored, Input, MatchKind};

use super::checks::Check;
use super::detect::Kind;
use super::Guard;

enum Matcher {
    Re(regex::Regex),
    Words(AhoCorasick),
}

struct Detector {
    kind: Kind,
    matcher: Matcher,
    check: Check,
}

/// One detector's source: its type, its pattern (or literal words), its check.
pub enum Source {
    Pattern(Kind, String, Check),
    Words(Vec<String>),
}

/// One guardrail's detectors, compiled.
pub struct Scanner {
    dets: Vec<Detector>,
    /// Every pattern and word in one unanchored search: no candidate of it in a text means no
    /// detector needs to look (most stream pieces).
    any: regex_automata::meta::Regex,
    pub(super) live: DFA,
    /// The lazy DFA's state cache (the scanner lives on one shard; borrowed only inside a call).
    pub(super) cache: RefCell<Cache>,
    hold: usize,
}

/// Longest match of `pattern` in bytes (`None`: unbounded or not a valid pattern).
pub fn max_len(pattern: &str) -> Result<Option<usize>, String> {
    let hir = regex_syntax::ParserBuilder::new()
        .build()
        .parse(pattern)
        .map_err(|e| e.to_string())?;
    Ok(hir.properties().maximum_len())
}

impl Scanner {
    pub fn new(sources: Vec<Source>) -> Result<Scanner, String> {
        let mut dets = Vec::with_capacity(sources.len());
        let mut live_pats: Vec<String> = Vec::new();
        let mut hold = 0usize;
        for s in sources {
            match s {
                Source::Pattern(kind, pat, check) => {
                    let n = max_len(&pat)?
                        .ok_or_else(|| format!("pattern {pat:?} has no longest match: bound its repetitions (e.g. {{1,64}} instead of + or *)"))?;
                    hold = hold.max(n);
                    let re = regex::RegexBuilder::new(&pat)
                        .size_limit(64 << 20)
                        .build()
                        .map_err(|e| e.to_string())?;
                    live_pats.push(pat);
                    dets.push(Detector {
                        kind,
                        matcher: Matcher::Re(re),
                        check,
                    });
                }
                Source::Words(words) => {
                    let words: Vec<String> = words.into_iter().filter(|w| !w.is_empty()).collect();
                    if words.is_empty() {
                        continue;
                    }
                    for w in &words {
                        hold = hold.max(w.len());
                        live_pats.push(format!("(?i-u:{})", regex_syntax::escape(w)));
                    }
                    let ac = AhoCorasick::builder()
                        .ascii_case_insensitive(true)
                        .match_kind(AcKind::LeftmostLongest)
                        .kind(Some(AhoCorasickKind::DFA))
                        .build(&words)
                        .or_else(|_| {
                            AhoCorasick::builder()
                                .ascii_case_insensitive(true)
                                .match_kind(AcKind::LeftmostLongest)
                                .build(&words)
                        })
                        .map_err(|e| e.to_string())?;
                    dets.push(Detector {
                        kind: Kind::Word,
                        matcher: Matcher::Words(ac),
                        check: Check::None,
                    });
                }
            }
        }
        let live = DFA::builder()
            .configure(
                DFA::config()
                    .match_kind(MatchKind::All)
                    .unicode_word_boundary(true)
                    .cache_capacity(2 << 20),
            )
            .thompson(regex_automata::nfa::thompson::Config::new().nfa_size_limit(Some(64 << 20)))
            .syntax(regex_automata::util::syntax::Config::new())
            .build_many(&live_pats)
            .map_err(|e| e.to_string())?;
        let cache = RefCell::new(live.create_cache());
        let any = regex_automata::meta::Regex::builder()
            .configure(regex_automata::meta::Config::new().nfa_size_limit(Some(64 << 20)))
            .build_many(&live_pats)
            .map_err(|e| e.to_string())?;
        Ok(Scanner {
            dets,
            any,
            live,
            cache,
            hold,
        })
    }

    /// The longest match of any detector, bytes: the most a stream holds back.
    pub fn hold(&self) -> usize {
        self.hold
    }

    /// The first position at or after `from` where a match may start that the bytes of `hay`
    /// do not decide yet (`hay.len()` if none). Never more than `hold` bytes before the end.
    fn live_from(&self, hay: &str, from: usize) -> usize {
        let len = hay.len();
        let mut floor = len.saturating_sub(self.hold);
        while !hay.is_char_boundary(floor) {
            floor += 1;
        }
        let Ok(mut cache) = self.cache.try_borrow_mut() else {
            return from.max(floor.min(len));
        };
        // positions more than `hold` bytes back are decided (no match is longer)
        let mut p = from.max(floor);
        while p < len {
            if hay.is_char_boundary(p) && self.is_live(&mut cache, hay, p) {
                return p;
            }
            p += 1;
        }
        len
    }

    /// Whether an anchored match of some pattern at `p` could still end after `hay`'s end.
    fn is_live(&self, cache: &mut Cache, hay: &str, p: usize) -> bool {
        let input = Input::new(hay).span(p..hay.len()).anchored(Anchored::Yes);
        let Ok(mut sid) = self.live.start_state_forward(cache, &input) else {
            return true;
        };
        if sid.is_dead() {
            return false;
        }
        for &b in hay.as_bytes().get(p..).unwrap_or_default() {
            match self.live.next_state(cache, sid, b) {
                Ok(s) => sid = s,
                Err(_) => return true,
            }
            if sid.is_tagged() {
                if sid.is_dead() {
                    return false;
                }
                if sid.is_quit() {
                    return true;
                }
            }
        }
        true
    }

    /// Detector `d`'s raw leftmost candidate at or after `from` in `hay`.
    fn candidate(&self, d: usize, hay: &str, from: usize) -> Option<(usize, usize)> {
        match &self.dets.get(d)?.matcher {
            Matcher::Re(re) => re.find_at(hay, from).map(|m| (m.start(), m.end())),
            Matcher::Words(ac) => {
                let input = aho_corasick::Input::new(hay).span(from..hay.len());
                ac.find(input).map(|m| (m.start(), m.end()))
            }
        }
    }

    /// The leftmost accepted match at or after `from` that starts before `before`: earliest
    /// start wins, then the detector listed first. `memo` keeps each detector's candidate for
    /// the rest of one pass over `hay` (`Memo::default()` per detector before the pass).
    fn next_match(
        &self,
        hay: &str,
        from: usize,
        before: usize,
        memo: &mut [Memo],
    ) -> Option<(usize, usize, Kind)> {
        if from >= before
            || !self
                .any
                .is_match(Input::new(hay).span(from..hay.len().max(from)))
        {
            return None;
        }
        let mut best: Option<(usize, usize, Kind)> = None;
        for (d, det) in self.dets.iter().enumerate() {
            let m = memo.get_mut(d)?;
            loop {
                let (s, e) = match *m {
                    Memo::None => break,
                    Memo::At(s, e) if s >= from => (s, e),
                    Memo::At(..) | Memo::Unknown => {
                        *m = self
                            .candidate(d, hay, from)
                            .map_or(Memo::None, |(s, e)| Memo::At(s, e));
                        continue;
                    }
                };
                if s >= before || best.is_some_and(|b| b.0 <= s) {
                    break;
                }
                match hay.get(s..e).and_then(|c| det.check.accept(c)) {
                    Some(n) => {
                        best = Some((s, s + n, det.kind));
                        break;
                    }
                    None => {
                        // rejected: look again from the next character
                        let next = hay
                            .get(s..)
                            .and_then(|t| t.chars().next())
                            .map_or(hay.len(), |c| s + c.len_utf8());
                        *m = if next > hay.len() {
                            Memo::None
                        } else {
                            self.candidate(d, hay, next)
                                .map_or(Memo::None, |(s, e)| Memo::At(s, e))
                        };
                    }
                }
            }
        }
        best
    }

    pub(super) fn detectors(&self) -> usize {
        self.dets.len()
    }
}

/// A detector's candidate during one pass.
#[derive(Debug, Clone, Copy, Default)]
pub(super) enum Memo {
    #[default]
    Unknown,
    /// None to the end of the text.
    None,
    At(usize, usize),
}

/// What to do with a match.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Action {
    Mask,
    Block,
    Warn,
}

impl Action {
    pub fn name(self) -> &'static str {
        match self {
            Action::Mask => "mask",
            Action::Block => "block",
            Action::Warn => "warn",
        }
    }
}

/// The unreleased end of one text being scanned (a content block, a tool call's arguments).
#[derive(Debug, Default)]
pub struct Tail {
    buf: String,
    /// Start of the unreleased bytes in `buf` (what is before is look-behind context).
    cursor: usize,
}

impl Tail {
    /// Bytes held back now.
    pub fn held(&self) -> usize {
        self.buf.len() - self.cursor
    }
}

/// `guard`'s pass (its scanner) over `tail` + `input`: released text is appended to `out`, each
/// match is reported to `hit` and, by `guard.action`, replaced by `guard.mask(kind)`
/// (`Action::Mask`), passed (`Warn`), or ends the pass with `Err(kind)` (`Block`; nothing of the
/// match is in `out`). `last`: the text ends here, everything is released.
pub(super) fn step(
    guard: &Guard,
    tail: &mut Tail,
    input: &str,
    last: bool,
    out: &mut String,
    hit: &mut dyn FnMut(Kind),
) -> Result<(), Kind> {
    let scanner = &guard.scanner;
    tail.buf.push_str(input);
    let len = tail.buf.len();
    let mut memo: smallvec::SmallVec<[Memo; 8]> =
        smallvec::smallvec![Memo::Unknown; scanner.detectors()];
    loop {
        let cur = tail.cursor;
        let live = if last {
            len
        } else {
            scanner.live_from(&tail.buf, cur)
        };
        match scanner.next_match(&tail.buf, cur, live, &mut memo) {
            Some((s, e, kind)) => {
                out.push_str(tail.buf.get(cur..s).unwrap_or_default());
                hit(kind);
                match guard.action {
                    Action::Mask => out.push_str(guard.mask(kind)),
                    Action::Warn => out.push_str(tail.buf.get(s..e).unwrap_or_default()),
                    Action::Block => {
                        tail.buf.clear();
                        tail.cursor = 0;
                        return Err(kind);
                    }
                }
                tail.cursor = e;
            }
            None => {
                out.push_str(tail.buf.get(cur..live).unwrap_or_default());
                tail.cursor = live;
                break;
            }
        }
    }
    if last {
        tail.buf.clear();
        tail.cursor = 0;
    } else {
        // keep one character of look-behind context before the unreleased bytes
        let keep = tail
            .buf
            .get(..tail.cursor)
            .and_then(|b| b.char_indices().next_back())
            .map_or(tail.cursor, |(i, _)| i);
        if keep > 0 {
            tail.buf.drain(..keep);
            tail.cursor -= keep;
        }
    }
    Ok(())
}
