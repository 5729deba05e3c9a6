//! Every ```` ```toml ```` block in `README.md` and `docs/**/*.md` is a config the binary accepts:
//! it parses as TOML, and `ringgate check` exits 0 on it — alone, or after a named preamble
//! block, as the HTML-comment marker before the block says. The convention (markers, what the
//! test provides: a temp dir with `cert.pem`/`key.pem`, every env var the block names) is
//! written down in `docs/README.md` ("TOML blocks are tested"); this file implements it.
//!
//! `docs_blocks_are_accepted` runs it over the repository (new pages are found by walking
//! `docs/`), `examples_are_accepted` over `examples/*.toml`, `docs_paths_exist` checks the files
//! the pages name; `broken_blocks_are_caught` runs the same checker over pages made up here,
//! each with one kind of mistake, and requires each to be reported.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

const BIN: &str = env!("CARGO_BIN_EXE_ringgate");

/// What the marker before a block asks for.
#[derive(Debug, Clone, PartialEq)]
enum Mode {
    Alone,
    Preamble(String),
    After(String),
    ParseOnly,
}

#[derive(Debug)]
struct Block {
    /// `path:line` of the opening fence, relative to the root.
    at: String,
    mode: Mode,
    text: String,
}

/// Markdown files checked under `root`: `README.md` and every `.md` below `docs/`, sorted.
fn pages(root: &Path) -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "md") {
                out.push(p);
            }
        }
    }
    let mut out = Vec::new();
    if root.join("README.md").is_file() {
        out.push(root.join("README.md"));
    }
    let mut docs = Vec::new();
    walk(&root.join("docs"), &mut docs);
    docs.sort();
    out.extend(docs);
    out
}

/// The marker on `line`, if it is one. `Ok(None)`: not a marker comment at all.
fn marker(line: &str) -> Result<Option<Mode>, String> {
    let t = line.trim();
    let Some(rest) = t.strip_prefix("<!--") else {
        return Ok(None);
    };
    let rest = rest.trim_start();
    let Some(rest) = rest.strip_prefix("check") else {
        return Ok(None);
    };
    let Some(body) = rest
        .trim_start()
        .strip_prefix(':')
        .and_then(|r| r.trim_end().strip_suffix("-->"))
    else {
        return Err(format!(
            "malformed marker `{t}` (write `<!-- check: MODE -->`)"
        ));
    };
    let body = body.trim();
    let word = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    };
    if let Some(name) = body.strip_prefix("preamble ") {
        let name = name.trim();
        return if word(name) {
            Ok(Some(Mode::Preamble(name.to_string())))
        } else {
            Err(format!("marker `{t}`: a preamble name is one word"))
        };
    }
    if let Some(name) = body.strip_prefix("after ") {
        let name = name.trim();
        return if word(name) {
            Ok(Some(Mode::After(name.to_string())))
        } else {
            Err(format!("marker `{t}`: `after` takes one preamble name"))
        };
    }
    if let Some(reason) = body.strip_prefix("parse-only") {
        let reason = reason.trim_start().strip_prefix(':').unwrap_or("").trim();
        return if reason.is_empty() {
            Err(format!(
                "marker `{t}`: parse-only needs a reason (`parse-only: why`)"
            ))
        } else {
            Ok(Some(Mode::ParseOnly))
        };
    }
    if body == "alone" {
        return Ok(Some(Mode::Alone));
    }
    Err(format!(
        "marker `{t}`: unknown mode (alone | preamble NAME | after NAME | parse-only: REASON)"
    ))
}

/// An opening or closing fence: (indent, fence char, run length, info string).
fn fence(line: &str) -> Option<(usize, char, usize, &str)> {
    let indent = line.len() - line.trim_start_matches(' ').len();
    let t = &line[indent..];
    let c = t.chars().next().filter(|c| *c == '`' || *c == '~')?;
    let run = t.chars().take_while(|x| *x == c).count();
    (run >= 3).then(|| (indent, c, run, t[run..].trim()))
}

/// Every toml block of one page; mistakes in the page's markup go to `errors`.
fn blocks_of(rel: &str, src: &str, errors: &mut Vec<String>) -> Vec<Block> {
    let lines: Vec<&str> = src.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let Some((indent, c, run, info)) = fence(lines[i]) else {
            i += 1;
            continue;
        };
        let lang = info.split_whitespace().next().unwrap_or("");
        let at = format!("{rel}:{}", i + 1);
        // the closing fence: same char, at least as long, nothing after it
        let close = (i + 1..lines.len()).find(|&k| {
            fence(lines[k]).is_some_and(|(_, c2, r2, rest)| c2 == c && r2 >= run && rest.is_empty())
        });
        let Some(close) = close else {
            errors.push(format!("{at}: a ``` block that is never closed"));
            break;
        };
        if lang == "toml" {
            let before = lines[..i].iter().rev().find(|l| !l.trim().is_empty());
            let mode = match before.map(|l| marker(l)) {
                Some(Ok(Some(m))) => m,
                Some(Err(e)) => {
                    errors.push(format!("{at}: {e}"));
                    i = close + 1;
                    continue;
                }
                _ => Mode::Alone,
            };
            let text: String = lines[i + 1..close]
                .iter()
                .map(|l| {
                    let strip = l.len() - l.trim_start_matches(' ').len();
                    format!("{}\n", &l[strip.min(indent)..])
                })
                .collect();
            out.push(Block { at, mode, text });
        }
        i = close + 1;
    }
    out
}

/// Env var names the config names: the value of every `…_env` key, and `env` keys (the
/// entries of `api_keys`), at any depth.
fn env_names(v: &toml::Value, out: &mut Vec<String>) {
    match v {
        toml::Value::Table(t) => {
            for (k, x) in t {
                match x {
                    toml::Value::String(s) if k == "env" || k.ends_with("_env") => {
                        out.push(s.clone())
                    }
                    _ => env_names(x, out),
                }
            }
        }
        toml::Value::Array(a) => a.iter().for_each(|x| env_names(x, out)),
        _ => {}
    }
}

static DIRS: AtomicUsize = AtomicUsize::new(0);

/// A fresh directory holding `cert.pem` and `key.pem` (self-signed for localhost).
fn sandbox(tls: &(String, String)) -> PathBuf {
    let n = DIRS.fetch_add(1, Ordering::Relaxed);
    let d = std::env::temp_dir().join(format!("ringgate-docs-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(d.join("xdg")).unwrap();
    std::fs::write(d.join("cert.pem"), &tls.0).unwrap();
    std::fs::write(d.join("key.pem"), &tls.1).unwrap();
    d
}

fn self_signed() -> (String, String) {
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_string()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    (cert.pem(), key.serialize_pem())
}

/// `ringgate check` on `text` as `ringgate.toml` in a sandbox; `Err` carries its output.
fn check(text: &str, tls: &(String, String)) -> Result<(), String> {
    let parsed: toml::Value = toml::from_str(text).map_err(|e| format!("not valid TOML: {e}"))?;
    let mut names = Vec::new();
    env_names(&parsed, &mut names);
    let dir = sandbox(tls);
    std::fs::write(dir.join("ringgate.toml"), text).unwrap();
    let mut cmd = Command::new(BIN);
    cmd.args(["check", "--config", "ringgate.toml"])
        .current_dir(&dir)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", &dir)
        .env("XDG_DATA_HOME", dir.join("xdg"));
    for n in &names {
        cmd.env(n, "docs-test-secret-0123456789abcdef");
    }
    let out = cmd.output().expect("run ringgate check");
    let _ = std::fs::remove_dir_all(&dir);
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`ringgate check` exit {:?}:\n{}{}",
            out.status.code(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// Checks every block under `root`; returns (blocks checked, problems).
fn check_tree(root: &Path) -> (usize, Vec<String>) {
    let mut errors = Vec::new();
    let mut blocks = Vec::new();
    for p in pages(root) {
        let rel = p.strip_prefix(root).unwrap_or(&p).display().to_string();
        let src = std::fs::read_to_string(&p).unwrap();
        blocks.extend(blocks_of(&rel, &src, &mut errors));
    }
    let mut preambles: BTreeMap<String, (String, String)> = BTreeMap::new();
    for b in &blocks {
        if let Mode::Preamble(name) = &b.mode {
            if let Some((first, _)) = preambles.get(name) {
                errors.push(format!(
                    "{}: preamble `{name}` is already defined at {first}",
                    b.at
                ));
            } else {
                preambles.insert(name.clone(), (b.at.clone(), b.text.clone()));
            }
        }
    }
    let tls = self_signed();
    for b in &blocks {
        let result = match &b.mode {
            Mode::ParseOnly => toml::from_str::<toml::Value>(&b.text)
                .map(|_| ())
                .map_err(|e| format!("not valid TOML: {e}")),
            Mode::Alone | Mode::Preamble(_) => check(&b.text, &tls),
            Mode::After(name) => match preambles.get(name) {
                None => Err(format!(
                    "no block is marked `<!-- check: preamble {name} -->`"
                )),
                Some((_, pre)) => toml::from_str::<toml::Value>(&b.text)
                    .map_err(|e| format!("not valid TOML (the block alone): {e}"))
                    .and_then(|_| check(&format!("{pre}\n{}", b.text), &tls))
                    .map_err(|e| {
                        let skip = pre.lines().count() + 1;
                        format!(
                            "{e}(checked text: preamble `{name}`, a blank line, then the \
                             block: its first line is line {})",
                            skip + 1
                        )
                    }),
            },
        };
        if let Err(e) = result {
            errors.push(format!("{} ({:?}): {e}", b.at, b.mode));
        }
    }
    (blocks.len(), errors)
}

#[test]
fn docs_blocks_are_accepted() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let (n, errors) = check_tree(root);
    assert!(
        errors.is_empty(),
        "{} of the toml blocks in README.md and docs/ are not accepted \
         (conventions: docs/README.md, \"TOML blocks are tested\"):\n\n{}",
        errors.len(),
        errors.join("\n\n")
    );
    // the walk found the pages: README's minimal config, the reference, the preamble …
    assert!(
        n >= 10,
        "only {n} toml blocks found under {}",
        root.display()
    );
}

/// Repository paths the pages name (a relative link, or a code span starting with a top-level
/// folder of the checkout such as `src/…`, `tests/…`, `bench-results/…`) exist: a page that
/// still names a moved or deleted file fails here. Spans with placeholders (`<…>`, `*`, `…`,
/// `{…}`) are not paths.
fn dangling_paths(root: &Path) -> Vec<String> {
    const TOPS: &[&str] = &[
        "src/",
        "tests/",
        "benches/",
        "bench-results/",
        "examples/",
        "docs/",
        "ops/",
        "tuning/",
        "packaging/",
        "ansible/",
        "fuzz/",
        ".ci/",
    ];
    let placeholder = |p: &str| p.contains(['<', '>', '*', '…', '{', '}', '|', '$']);
    let mut out = Vec::new();
    for page in pages(root) {
        let rel = page
            .strip_prefix(root)
            .unwrap_or(&page)
            .display()
            .to_string();
        let src = std::fs::read_to_string(&page).unwrap();
        let dir = page.parent().unwrap_or(root);
        for (n, line) in src.lines().enumerate() {
            // code spans: `path` (the text between paired backticks)
            for (i, span) in line.split('`').enumerate() {
                if i % 2 == 0 || !TOPS.iter().any(|t| span.starts_with(t)) || placeholder(span) {
                    continue;
                }
                let path = span.split([' ', ':', '#']).next().unwrap_or(span);
                let path = path.trim_end_matches(['.', ',', ';', ')']);
                if !root.join(path).exists() {
                    out.push(format!("{rel}:{}: `{span}` does not exist", n + 1));
                }
            }
            // links: ](target) and ](target#anchor), relative to the page
            for piece in line.split("](").skip(1) {
                let Some(end) = piece.find(')') else { continue };
                let target = piece[..end].split('#').next().unwrap_or("");
                if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                if !dir.join(target).exists() {
                    out.push(format!("{rel}:{}: link ({target}) does not exist", n + 1));
                }
            }
        }
    }
    out
}

#[test]
fn docs_paths_exist() {
    // the check itself: a page naming a missing file is reported
    let tmp = std::env::temp_dir().join(format!("ringgate-docs-paths-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(tmp.join("docs")).unwrap();
    std::fs::create_dir_all(tmp.join("src")).unwrap();
    std::fs::write(tmp.join("src/here.rs"), "").unwrap();
    std::fs::write(
        tmp.join("docs/page.md"),
        "`src/here.rs` and `src/gone.rs`, [ok](../src/here.rs#x), [gone](nope.md), \
         `src/<stage>/x.rs`, [web](https://example.com/a)\n",
    )
    .unwrap();
    let found = dangling_paths(&tmp);
    let _ = std::fs::remove_dir_all(&tmp);
    assert_eq!(
        found,
        [
            "docs/page.md:1: `src/gone.rs` does not exist",
            "docs/page.md:1: link (nope.md) does not exist"
        ],
        "the path check itself"
    );
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dangling = dangling_paths(root);
    assert!(
        dangling.is_empty(),
        "pages name files that are not there:\n{}",
        dangling.join("\n")
    );
}

/// The files in `examples/` the pages point at are whole configs `ringgate check` accepts, under
/// the same sandbox (env vars they name set, `cert.pem`/`key.pem` beside them).
#[test]
fn examples_are_accepted() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    files.sort();
    assert!(files.len() >= 4, "examples/*.toml: {files:?}");
    let tls = self_signed();
    let errors: Vec<String> = files
        .iter()
        .filter_map(|f| {
            let text = std::fs::read_to_string(f).unwrap();
            check(&text, &tls)
                .err()
                .map(|e| format!("{}: {e}", f.display()))
        })
        .collect();
    assert!(errors.is_empty(), "{}", errors.join("\n\n"));
}

/// One made-up page per mistake, each run through the checker on its own (as
/// `docs/sub/page.md`: pages deeper in `docs/` are found too); every one must be reported with
/// what went wrong, and the well-formed pages must pass.
#[test]
fn broken_blocks_are_caught() {
    const GOOD: &str = "```toml\n[[provider]]\nname = \"p\"\nkind = \"mock\"\n\n\
                        [[model]]\nname = \"m\"\nprovider = \"p\"\n```\n";
    const PRE: &str = "<!-- check: preamble base -->\n\
                       ```toml\n[[provider]]\nname = \"local\"\nkind = \"mock\"\n```\n\n";
    const AFTER: &str = "<!-- check: after base -->\n```toml\n[[model]]\nname = \"m\"\n";
    // (what the page shows, the page, a piece of the report it must get; "" = must pass)
    let cases: Vec<(&str, String, &str)> = vec![
        ("a config alone", GOOD.into(), ""),
        ("a block after its preamble", format!("{PRE}{AFTER}provider = \"local\"\n```\n"), ""),
        ("parse-only with a reason", "<!-- check: parse-only: a shape -->\n```toml\n[[model]]\nname = \"m\"\n```\n".into(), ""),
        ("an explicit `alone`", format!("<!-- check: alone -->\n{GOOD}"), ""),
        ("token env var set by the test", "```toml\n[admin]\nlisten = \"0.0.0.0:18081\"\ntoken_env = \"DOCS_T\"\n```\n".into(), ""),
        ("tls files given by the test", "```toml\n[server]\ntls_listen = \"127.0.0.1:18443\"\ntls_cert = \"cert.pem\"\ntls_key = \"key.pem\"\n```\n".into(), ""),
        ("a toml fence inside another block", "````markdown\n```toml\nbroken =\n```\n````\n".into(), ""),
        ("not toml", "```toml\n[server\nlisten = 1\n```\n".into(), "not valid TOML"),
        ("unknown provider", "```toml\n[[model]]\nname = \"m\"\nprovider = \"nope\"\n```\n".into(), "unknown provider"),
        ("unknown field", format!("{}[server]\nlisten_addr = \"127.0.0.1:1\"\n```\n", GOOD.trim_end_matches("```\n")), "unknown field `listen_addr`"),
        ("a missing tls file", "```toml\n[server]\ntls_listen = \"127.0.0.1:18443\"\ntls_cert = \"nope.pem\"\ntls_key = \"key.pem\"\n```\n".into(), "nope.pem"),
        ("the block broken after a good preamble", format!("{PRE}{AFTER}provider = \"other\"\n```\n"), "unknown provider"),
        ("the block alone not toml", format!("{PRE}{AFTER}provider =\n```\n"), "the block alone"),
        ("an undefined preamble", "<!-- check: after nowhere -->\n```toml\na = 1\n```\n".into(), "preamble nowhere"),
        ("a preamble twice", format!("{PRE}{PRE}"), "already defined"),
        ("parse-only without a reason", "<!-- check: parse-only -->\n```toml\na = 1\n```\n".into(), "needs a reason"),
        ("parse-only, broken", "<!-- check: parse-only: a shape -->\n```toml\na =\n```\n".into(), "not valid TOML"),
        ("an unknown mode", format!("<!-- check: maybe -->\n{GOOD}"), "unknown mode"),
        ("a malformed marker", format!("<!-- check after base -->\n{GOOD}"), "malformed marker"),
        ("an unclosed fence", "```toml\na = 1\n".into(), "never closed"),
        ("an indented block in a list", "- item\n\n  ```toml\n  [[model]]\n  name = \"m\"\n  provider = \"x\"\n  ```\n".into(), "unknown provider"),
    ];
    let mut wrong = Vec::new();
    for (i, (name, page, want)) in cases.iter().enumerate() {
        let root =
            std::env::temp_dir().join(format!("ringgate-docs-cases-{}-{i}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("docs/sub")).unwrap();
        std::fs::write(root.join("docs/sub/page.md"), page).unwrap();
        let (n, errors) = check_tree(&root);
        let _ = std::fs::remove_dir_all(&root);
        let ok = if want.is_empty() {
            errors.is_empty() && (n > 0 || name.contains("inside another"))
        } else {
            errors.iter().any(|e| e.contains(want))
        };
        if !ok {
            wrong.push(format!(
                "`{name}` (want {want:?}): {n} block(s), reported {errors:#?}"
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "the checker got these wrong:\n{}",
        wrong.join("\n")
    );
}
