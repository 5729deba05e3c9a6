//! What a reload refuses although the file parses and validates: a file that looks emptied or
//! cut short. A zero-byte file (what `>` and a full disk leave) parses as a config with no
//! providers, models or keys, and a file cut at a line boundary parses as a config without its
//! tail; applied, either one answers every request 404 or 401. So a reload is refused when
//!
//! - the file is empty or only whitespace (always: there is nothing to apply);
//! - it has no `[[model]]` while the running config has some, or no `[[key]]` while the
//!   running config has some — unless the file says `[reload] allow_empty = true`;
//! - it does not end with a newline while the running file did (its last line may be cut
//!   short mid-write).
//!
//! Each refusal says what to write instead. The caller (`Reloader::reload`) logs, counts and
//! reports it like any invalid file, and the running config keeps serving.
//!
//! Owns: `check`. Must not: read files or apply anything.

use crate::config::{Config, ConfigError};

/// How to replace a config file so that no reload ever reads half of it.
pub const ATOMIC: &str =
    "replace the file in one step: write a temp file next to it, then rename it over the config";

/// Why the new file (`text`, parsed as `new`) must not replace `running` (whose file ended with
/// a newline when `running_ends_nl`); empty when it may.
pub fn check(
    running: &Config,
    running_ends_nl: bool,
    text: &str,
    new: &Config,
) -> Vec<ConfigError> {
    let problem = |line: Option<usize>, message: String| ConfigError { line, message };
    if text.trim().is_empty() {
        let what = if text.is_empty() {
            "is empty (0 bytes)".to_string()
        } else {
            format!("holds only whitespace ({} bytes)", text.len())
        };
        return vec![problem(
            None,
            format!("refused: the file {what} — a write in progress or a full disk? A reload never applies an empty file; {ATOMIC}"),
        )];
    }
    let mut out = Vec::new();
    if running_ends_nl && !text.ends_with('\n') {
        out.push(problem(
            Some(text.lines().count().max(1)),
            format!("refused: the file does not end with a newline (the running one did), so its last line may be cut short; end it with a newline ({ATOMIC})"),
        ));
    }
    if !new.reload.allow_empty {
        let explicit = "to mean it, write `[reload]` with `allow_empty = true` in the file";
        if new.models.is_empty() && !running.models.is_empty() {
            out.push(problem(
                None,
                format!(
                    "refused: the file has no [[model]] and would remove all {} running model(s) (every request would get 404) — a file cut short? {explicit}",
                    running.models.len()
                ),
            ));
        }
        if new.keys.is_empty() && !running.keys.is_empty() {
            out.push(problem(
                None,
                format!(
                    "refused: the file has no [[key]] and would remove all {} config key(s) (their clients would get 401) — a file cut short? {explicit}",
                    running.keys.len()
                ),
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const RUNNING: &str = "[[provider]]\nname = \"p\"\nkind = \"mock\"\n\n[[model]]\nname = \"m\"\nprovider = \"p\"\n\n[[key]]\nname = \"k\"\nkey_env = \"RG_GUARD_UNIT_KEY\"\n";

    fn refused(text: &str) -> Vec<ConfigError> {
        let running = Config::parse(RUNNING).unwrap();
        let new = Config::parse(text).unwrap();
        check(&running, true, text, &new)
    }

    #[test]
    fn empty_truncated_and_explicit() {
        for text in ["", " \n\t\n"] {
            let p = refused(text);
            assert_eq!(p.len(), 1, "{p:?}");
            assert!(p[0].message.contains("rename"), "{p:?}");
        }
        // cut after the provider: no model, no key
        let cut = &RUNNING[..RUNNING.find("[[model]]").unwrap()];
        let p = refused(cut);
        assert_eq!(p.len(), 2, "{p:?}");
        assert!(
            p.iter().all(|p| p.message.contains("allow_empty = true")),
            "{p:?}"
        );
        // cut before the key: the keys only
        let p = refused(&RUNNING[..RUNNING.find("[[key]]").unwrap()]);
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(p[0].message.contains("[[key]]"), "{p:?}");
        // said explicitly
        assert!(refused(&format!("{cut}[reload]\nallow_empty = true\n")).is_empty());
        // cut mid-line (still parses): no final newline
        let p = refused(RUNNING.trim_end_matches('\n'));
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!(p[0].line, Some(11), "{p:?}");
        assert!(refused(RUNNING).is_empty());
    }
}
