//! The `mcp_tools` allow-list: glob patterns (`*` any run, `?` one character) over federated
//! tool names (`server__tool`).
//!
//! Owns: `matches` and `allowed`. Must not: allocate, or backtrack without bound (the match is
//! the linear two-pointer algorithm: one remembered star, at most `|pattern| * |name|` steps).

/// Whether `name` matches `pat` as a whole.
pub fn matches(pat: &[u8], name: &[u8]) -> bool {
    let (mut p, mut n) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while n < name.len() {
        match pat.get(p) {
            Some(b'*') => {
                star = Some((p, n));
                p += 1;
            }
            Some(&c) if c == b'?' || c == name[n] => {
                p += 1;
                n += 1;
            }
            _ => match star {
                Some((sp, sn)) => {
                    p = sp + 1;
                    n = sn + 1;
                    star = Some((sp, sn + 1));
                }
                None => return false,
            },
        }
    }
    pat[p.min(pat.len())..].iter().all(|&c| c == b'*')
}

/// Whether a key with allow-list `list` (`None`: every tool) may see and call `name`.
pub fn allowed(list: Option<&[Box<str>]>, name: &str) -> bool {
    match list {
        None => true,
        Some(l) => l.iter().any(|p| matches(p.as_bytes(), name.as_bytes())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_whole_names() {
        let m = |p: &str, n: &str| matches(p.as_bytes(), n.as_bytes());
        assert!(m("files__read_*", "files__read_file"));
        assert!(m("files__read_*", "files__read_"));
        assert!(!m("files__read_*", "files__write"));
        assert!(!m("files__read_*", "xfiles__read_a"));
        assert!(m("search__*", "search__web"));
        assert!(m("*", "anything"));
        assert!(m("a?c", "abc"));
        assert!(!m("a?c", "ac"));
        assert!(m("*__echo", "one__echo"));
        assert!(!m("*__echo", "one__echo2"));
        assert!(m("a*b*c", "aXXbYYc"));
        assert!(!m("a*b*c", "aXXbYY"));
        assert!(!m("exact", "exact2"));
        assert!(m("exact", "exact"));
    }

    #[test]
    fn absent_list_allows_every_tool_and_empty_none() {
        assert!(allowed(None, "x__y"));
        assert!(!allowed(Some(&[]), "x__y"));
        let l: Vec<Box<str>> = vec!["x__*".into()];
        assert!(allowed(Some(&l), "x__y"));
        assert!(!allowed(Some(&l), "z__y"));
    }

    #[test]
    fn many_stars_stay_linear() {
        let pat = "*a".repeat(80);
        let name = "a".repeat(159) + "b";
        let t = std::time::Instant::now();
        assert!(!matches(pat.as_bytes(), name.as_bytes()));
        assert!(t.elapsed() < std::time::Duration::from_secs(5));
    }
}
