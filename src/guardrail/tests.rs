//! The masker's properties: streaming at any split points equals masking the whole text, the
//! hold-back never exceeds the longest match, checks reject what they must.

use std::rc::Rc;

use super::chain::mask_text;
use super::*;

pub(crate) fn guards(toml: &str) -> Vec<Rc<Guard>> {
    let text = format!("{toml}\n[[provider]]\nname = \"mock\"\nkind = \"mock\"\n");
    let cfg = crate::config::Config::parse(&text).unwrap();
    cfg.guardrails
        .iter()
        .map(|g| Rc::new(Guard::compile(g).unwrap()))
        .collect()
}

pub(crate) fn session(g: &[Rc<Guard>]) -> Session {
    Session {
        request: g.to_vec(),
        response: g.to_vec(),
        hits: Default::default(),
    }
}

const PII: &str = "[[guardrail]]\nname = \"pii\"\ndetect = [\"email\", \"phone\", \"credit_card\", \"iban\", \"us_ssn\", \"ipv4\"]\naction = \"mask\"\n\n[[guardrail]]\nname = \"secrets\"\ndetect = [\"secrets\"]\naction = \"mask\"\nwords = [\"codename-x\"]\npatterns = ['(?i)\\bproject\\s{1,4}falcon\\b']\n";

fn whole(g: &[Rc<Guard>], text: &str) -> String {
    let s = session(g);
    mask_text(g, &s, Phase::Response, text)
        .unwrap()
        .unwrap_or_else(|| text.to_string())
}

/// Stream `text` cut at `cuts` (byte offsets, snapped to char boundaries); returns the output
/// and asserts the hold-back bound after every piece.
fn streamed(g: &[Rc<Guard>], text: &str, cuts: &[usize]) -> String {
    let s = session(g);
    let hold: usize = g.iter().map(|x| x.scanner.hold()).sum();
    let mut c = Chain::new(g);
    let mut out = String::new();
    let mut at = 0;
    let mut fed = 0;
    let mut points: Vec<usize> = cuts.iter().map(|&x| x.min(text.len())).collect();
    points.sort_unstable();
    points.push(text.len());
    for p in points {
        let mut p = p;
        while !text.is_char_boundary(p) {
            p += 1;
        }
        if p < at {
            continue;
        }
        c.feed(g, &s, Phase::Response, &text[at..p], false, &mut out)
            .unwrap();
        fed += p - at;
        at = p;
        assert!(c.held() <= hold, "held {} > hold {hold}", c.held());
        let _ = fed;
    }
    c.feed(g, &s, Phase::Response, "", true, &mut out).unwrap();
    out
}

#[test]
fn builtins_mask_what_they_should() {
    let g = guards(PII);
    let t = "mail alice.smith@example.com or call +1 415 555 2671, card 4111 1111 1111 1111, \
             iban DE89 3704 0044 0532 0130 00, ssn 123-45-6789, host 10.0.0.12, key \
             sk-ant-api03-abcdefghijklmnopqrstuvwxyz0123, aws AKIAIOSFODNN7EXAMPLE, \
             gh ghp_abcdefghijklmnopqrstuvwxyz0123456789, codename-X and Project Falcon.";
    let m = whole(&g, t);
    for bad in [
        "alice", "2671", "4111", "DE89", "6789", "10.0.0", "sk-ant", "AKIA", "ghp_", "codename",
        "Falcon",
    ] {
        assert!(!m.contains(bad), "{bad} left in {m}");
    }
    for label in [
        "EMAIL",
        "PHONE",
        "CREDIT_CARD",
        "IBAN",
        "US_SSN",
        "IPV4",
        "SECRET",
        "WORD",
        "PATTERN",
    ] {
        assert!(
            m.contains(&format!("[REDACTED:{label}]")),
            "{label} missing in {m}"
        );
    }
}

#[test]
fn checksums_decide() {
    let g = guards(PII);
    for t in [
        "card 4111 1111 1111 1112 ok",
        "iban DE88 3704 0044 0532 0130 00 ok",
        "number 1234567812345678 ok",
    ] {
        assert_eq!(whole(&g, t), t);
    }
    assert_eq!(
        whole(&g, "x 4111111111111111 y"),
        "x [REDACTED:CREDIT_CARD] y"
    );
    assert_eq!(whole(&g, "GB82WEST12345698765432"), "[REDACTED:IBAN]");
}

#[test]
fn stream_equals_whole_at_every_split() {
    let g = guards(PII);
    let t = "Hi bob@mail.example.org, your card 5555-5555-5555-4444 and key \
             sk-proj-ABCDEFGHIJKLMNOPQRSTUVWXYZ012345 — ünïcödé 030 1234 5678 end";
    let want = whole(&g, t);
    for a in 0..=t.len() {
        assert_eq!(streamed(&g, t, &[a]), want, "split at {a}");
        for b in (a..=t.len()).step_by(7) {
            assert_eq!(
                streamed(&g, t, &[a, b, (a + b) / 2]),
                want,
                "split at {a},{b}"
            );
        }
    }
    let every: Vec<usize> = (0..t.len()).collect();
    assert_eq!(streamed(&g, t, &every), want);
}

#[test]
fn plain_text_is_released_at_once() {
    let g = guards(PII);
    let s = session(&g);
    let mut c = Chain::new(&g);
    let mut out = String::new();
    c.feed(
        &g,
        &s,
        Phase::Response,
        "The weather is nice today. ",
        false,
        &mut out,
    )
    .unwrap();
    // only a word that could still start something is held (here: nothing but the space)
    assert!(out.len() >= "The weather is nice today.".len(), "{out:?}");
}

#[test]
fn block_reports_guard_and_type_not_text() {
    let g =
        guards("[[guardrail]]\nname = \"secrets\"\ndetect = [\"secrets\"]\naction = \"block\"\n");
    let s = session(&g);
    let err = mask_text(&g, &s, Phase::Request, "use AKIAIOSFODNN7EXAMPLE now").unwrap_err();
    let msg = err.message();
    assert!(
        msg.contains("\"secrets\"") && msg.contains("secrets detected"),
        "{msg}"
    );
    assert!(!msg.contains("AKIA"));
    let mut c = Chain::new(&g);
    let mut out = String::new();
    let t = "use AKIAIOSFODNN7EXAMPLE now";
    let r = c.feed(&g, &s, Phase::Response, &t[..10], false, &mut out);
    assert!(r.is_ok());
    let r = c.feed(&g, &s, Phase::Response, &t[10..], false, &mut out);
    assert!(r.is_err());
    assert!(!out.contains("AKIA"), "{out}");
}

#[test]
fn tool_arguments_stay_json() {
    let g = guards(PII);
    let s = session(&g);
    let args = r#"{"to":"eve@evil.example","note":"line\nbreak \u00e9","n":4111111111111111}"#;
    let m = json_str::mask_json_text(&g, &s, Phase::Response, args)
        .unwrap()
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(&m).unwrap();
    assert_eq!(v["to"], "[REDACTED:EMAIL]");
    assert_eq!(v["note"], "line\nbreak é");
    assert_eq!(
        v["n"], 4111111111111111u64,
        "numbers are not strings: untouched"
    );
    for cut in 0..args.len() {
        let mut j = json_str::JsonText::new(&g);
        let mut out = String::new();
        j.feed(&g, &s, Phase::Response, &args[..cut], false, &mut out)
            .unwrap();
        j.feed(&g, &s, Phase::Response, &args[cut..], true, &mut out)
            .unwrap();
        assert_eq!(out, m, "cut {cut}");
    }
}

#[test]
fn hostile_inputs_finish() {
    let g = guards(
        "[[guardrail]]\nname = \"p\"\npatterns = ['(a{1,32}){1,32}b', '(x|xx){1,64}y']\naction = \"mask\"\n",
    );
    let start = std::time::Instant::now();
    let t = "a".repeat(1 << 20);
    assert_eq!(whole(&g, &t), t);
    let t = "x".repeat(1 << 20);
    assert_eq!(whole(&g, &t), t);
    assert!(start.elapsed() < std::time::Duration::from_secs(30));
}

#[test]
fn unbounded_patterns_are_refused() {
    let text = "[[guardrail]]\nname = \"p\"\npatterns = ['a+b']\naction = \"mask\"\n";
    let e = crate::config::Config::parse(text).unwrap_err();
    assert!(e[0].message.contains("no longest match"), "{e:?}");
    let text = "[[guardrail]]\nname = \"p\"\ndetect = [\"secrets\"]\naction = \"mask\"\nmax_hold_bytes = 100\n";
    assert!(crate::config::Config::parse(text).is_err());
    let text = "[[model]]\nname = \"m\"\nprovider = \"x\"\nguardrails = [\"nope\"]\n";
    let e = crate::config::Config::parse(text).unwrap_err();
    assert!(
        e.iter()
            .any(|e| e.message.contains("no [[guardrail]] named")),
        "{e:?}"
    );
}

/// The fuzz target's property on pseudo-random texts built from fragments that start, break
/// and complete matches, cut at pseudo-random offsets.
#[test]
fn random_texts_and_cuts_stream_like_whole() {
    let frags = [
        "a",
        "@",
        ".",
        " ",
        "alice",
        "example.com",
        "+1 ",
        "415",
        "-555-",
        "2671",
        "4111",
        " 1111",
        "DE89",
        " 3704",
        "0044",
        "sk-",
        "ant-",
        "api03",
        "abcdefghijklmnop",
        "AKIA",
        "0123456789",
        "é",
        "ü",
        "\n",
        "codename",
        "-x",
        "Project",
        " falcon",
        "aab",
        "10.0.",
        "1",
        "eyJ",
        "hbGciOiJIUzI1NiJ9",
        "-----BEGIN PRIVATE KEY-----",
        "-----END PRIVATE KEY-----",
    ];
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = move |n: usize| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % n as u64) as usize
    };
    for _ in 0..400 {
        let mut t = String::new();
        for _ in 0..next(40) {
            t.push_str(frags[next(frags.len())]);
        }
        let cuts: Vec<usize> = (0..next(12)).map(|_| next(t.len() + 1)).collect();
        let (s, w, held, bound) = crate::fuzzing::guardrail_stream_vs_whole(&t, &cuts);
        assert_eq!(s, w, "text {t:?} cuts {cuts:?}");
        assert!(held <= bound);
    }
}

/// A Responses stream whose held tail goes out in a closing delta keeps its `sequence_number`s
/// consecutive: the added delta takes the next number and every later event moves up by one.
#[test]
fn responses_closing_deltas_keep_sequence_numbers_consecutive() {
    use crate::dialect::Dialect;
    let g = guards(PII);
    let sess = Rc::new(session(&g));
    let mut sg = super::stream::StreamGuard::new(&sess, Dialect::Responses).unwrap();
    let ev = |seq: u64, ty: &str, extra: &str| {
        format!(
            "event: {ty}\ndata: {{\"type\":\"{ty}\",\"sequence_number\":{seq},\"item_id\":\"msg_1\",\"output_index\":0,\"content_index\":0{extra}}}\n\n"
        )
    };
    let input = [
        ev(
            0,
            "response.output_text.delta",
            ",\"delta\":\"write to bob@exa\"",
        ),
        ev(1, "response.output_text.delta", ",\"delta\":\"mple.com\""),
        ev(
            2,
            "response.output_text.done",
            ",\"text\":\"write to bob@example.com\"",
        ),
        ev(3, "response.content_part.done", ""),
    ];
    let mut out = Vec::new();
    for e in &input {
        sg.rewrite(e.as_bytes(), &mut out).unwrap();
    }
    sg.finish(&mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert!(!text.contains("bob@"), "{text}");
    let seqs: Vec<u64> = text
        .split("\n\n")
        .filter_map(|e| e.lines().find_map(|l| l.strip_prefix("data: ")))
        .map(|d| serde_json::from_str::<serde_json::Value>(d).unwrap())
        .map(|v| v["sequence_number"].as_u64().unwrap())
        .collect();
    assert!(
        seqs.len() > input.len(),
        "a closing delta was added: {text}"
    );
    let want: Vec<u64> = (0..seqs.len() as u64).collect();
    assert_eq!(seqs, want, "{text}");
}
