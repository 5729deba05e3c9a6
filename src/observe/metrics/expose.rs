//! One Prometheus text exposition from several parts: each shard's rendering of itself (the
//! serving shard's fresh, the others' latest snapshots) and the process-wide lines. Parts may
//! repeat `# HELP`/`# TYPE` lines and series; the result has every family once, its `# HELP`
//! and `# TYPE` first, then its series, identical series (same name and labels) summed. That
//! sum is how per-shard counters and histograms merge: a renderer that leaves the `shard`
//! label out gets one series over all shards; one that writes it keeps a series per shard.
//!
//! Owns: `merge`, `help` (a family's two header lines), `single` (a family of one series). Must not: be called on the request
//! path (it parses text; it runs once per scrape, off every other shard).

use std::collections::HashMap;
use std::fmt::Write;
use std::hash::{BuildHasherDefault, Hasher};

/// Write a family's `# HELP` and `# TYPE` lines (`kind`: counter, gauge, histogram).
pub fn help(out: &mut String, name: &str, kind: &str, text: &str) {
    let _ = writeln!(out, "# HELP {name} {text}\n# TYPE {name} {kind}");
}

/// Write a family of one series: its header lines, then `name{labels} value` (`labels`
/// rendered without braces; empty: no braces).
pub fn single(
    out: &mut String,
    (name, kind, text): (&str, &str, &str),
    labels: &str,
    value: impl std::fmt::Display,
) {
    help(out, name, kind, text);
    let _ = if labels.is_empty() {
        writeln!(out, "{name} {value}")
    } else {
        writeln!(out, "{name}{{{labels}}} {value}")
    };
}

/// One family: its header texts and its series, all slices of the parts being merged.
#[derive(Default)]
struct Family<'a> {
    help: Option<&'a str>,
    kind: Option<&'a str>,
    /// (series text `name{labels}`, value) in first-seen order.
    series: Vec<(&'a str, f64)>,
    index: Map<'a, usize>,
}

/// Keyed by slices of the parts (no copies), hashed 8 bytes at a time.
type Map<'a, V> = HashMap<&'a str, V, BuildHasherDefault<WordHasher>>;

/// Merge `parts` into one exposition (see the module doc).
pub fn merge<'a>(parts: &[&'a str]) -> String {
    let mut order: Vec<&'a str> = Vec::new();
    let mut fams: Map<'a, Family<'a>> = Map::default();
    // Pass 1: metadata, so samples find their histogram family whatever the part order.
    for part in parts {
        for line in part.lines() {
            let Some(rest) = line.strip_prefix("# ") else {
                continue;
            };
            let (what, rest) = rest.split_once(' ').unwrap_or((rest, ""));
            let (name, text) = rest.split_once(' ').unwrap_or((rest, ""));
            if name.is_empty() || !(what == "HELP" || what == "TYPE") {
                continue;
            }
            let f = entry(&mut fams, &mut order, name);
            let slot = if what == "HELP" {
                &mut f.help
            } else {
                &mut f.kind
            };
            if slot.is_none() {
                *slot = Some(text);
            }
        }
    }
    // Pass 2: samples.
    for part in parts {
        for line in part.lines() {
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let Some((series, name, value)) = split_sample(line) else {
                continue;
            };
            let fam = family_of(name, &fams);
            let f = entry(&mut fams, &mut order, fam);
            match f.index.get(series) {
                Some(&i) => {
                    if let Some(s) = f.series.get_mut(i) {
                        s.1 += value;
                    }
                }
                None => {
                    f.index.insert(series, f.series.len());
                    f.series.push((series, value));
                }
            }
        }
    }
    let mut out = String::with_capacity(parts.iter().map(|p| p.len()).sum::<usize>() / 2 + 64);
    for name in &order {
        let Some(f) = fams.get(name) else { continue };
        if let Some(h) = f.help {
            let _ = writeln!(out, "# HELP {name} {h}");
        }
        if let Some(k) = f.kind {
            let _ = writeln!(out, "# TYPE {name} {k}");
        }
        for (series, v) in &f.series {
            out.push_str(series);
            out.push(' ');
            let _ = writeln!(out, "{}", Value(*v));
        }
    }
    out
}

/// The family `name`, made (and put last in `order`) when first seen.
fn entry<'m, 'a>(
    fams: &'m mut Map<'a, Family<'a>>,
    order: &mut Vec<&'a str>,
    name: &'a str,
) -> &'m mut Family<'a> {
    if !fams.contains_key(name) {
        order.push(name);
    }
    fams.entry(name).or_default()
}

/// FxHash-style: 8 bytes per multiply (the default SipHash costs several times more on the
/// ~100-byte series texts).
#[derive(Default)]
struct WordHasher(u64);

impl WordHasher {
    #[inline]
    fn add(&mut self, w: u64) {
        self.0 = (self.0.rotate_left(5) ^ w).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
}

impl Hasher for WordHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.add(u64::from_le_bytes(w));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(w) ^ ((rest.len() as u64) << 59));
        }
    }

    fn write_u8(&mut self, b: u8) {
        self.add(u64::from(b));
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// The family a sample named `name` belongs to: `x` for `x_bucket`, `x_sum`, `x_count` when
/// `x` is a declared histogram, else the name itself.
fn family_of<'a>(name: &'a str, fams: &Map<'_, Family<'_>>) -> &'a str {
    for suffix in ["_bucket", "_sum", "_count"] {
        if let Some(base) = name.strip_suffix(suffix) {
            let hist = fams
                .get(base)
                .and_then(|f| f.kind)
                .is_some_and(|k| k == "histogram" || k == "summary");
            if hist {
                return base;
            }
        }
    }
    name
}

/// `name{labels} value` → (`name{labels}`, `name`, value). Label values may hold escaped
/// quotes and braces.
fn split_sample(line: &str) -> Option<(&str, &str, f64)> {
    let b = line.as_bytes();
    let name_end = b.iter().position(|&c| c == b'{' || c == b' ')?;
    let name = &line[..name_end];
    let series_end = if b[name_end] == b'{' {
        let mut in_str = false;
        let mut esc = false;
        let mut end = None;
        for (i, &c) in b.iter().enumerate().skip(name_end + 1) {
            match (in_str, esc, c) {
                (true, true, _) => esc = false,
                (true, false, b'\\') => esc = true,
                (true, false, b'"') => in_str = false,
                (false, _, b'"') => in_str = true,
                (false, _, b'}') => {
                    end = Some(i + 1);
                    break;
                }
                _ => {}
            }
        }
        end?
    } else {
        name_end
    };
    let value = line[series_end..].split_whitespace().next()?;
    let v = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    Some((&line[..series_end], name, v))
}

/// A sample value in the text format (`+Inf`, `NaN`; integers without a fraction).
struct Value(f64);

impl std::fmt::Display for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let v = self.0;
        if v.is_nan() {
            f.write_str("NaN")
        } else if v == f64::INFINITY {
            f.write_str("+Inf")
        } else if v == f64::NEG_INFINITY {
            f.write_str("-Inf")
        } else {
            write!(f, "{v}")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_families_and_sums_identical_series() {
        let a = "# HELP c_total Things.\n# TYPE c_total counter\nc_total{x=\"1\"} 2\n\
                 g{shard=\"0\"} 5\n# HELP g A gauge.\n# TYPE g gauge\n";
        let b = "# HELP c_total Things.\n# TYPE c_total counter\nc_total{x=\"1\"} 3\n\
                 c_total{x=\"a}\\\"b\"} 1\ng{shard=\"1\"} 7\n";
        let out = merge(&[a, b]);
        assert_eq!(
            out,
            "# HELP c_total Things.\n# TYPE c_total counter\nc_total{x=\"1\"} 5\n\
             c_total{x=\"a}\\\"b\"} 1\n# HELP g A gauge.\n# TYPE g gauge\ng{shard=\"0\"} 5\n\
             g{shard=\"1\"} 7\n"
        );
    }

    #[test]
    fn histogram_lines_stay_in_their_family() {
        let h = "# HELP h Latency.\n# TYPE h histogram\n\
                 h_bucket{le=\"0.1\"} 1\nh_bucket{le=\"+Inf\"} 2\nh_sum 0.5\nh_count 2\n";
        let other = "# HELP h_count_total Not part of h.\n# TYPE h_count_total counter\n\
                     h_count_total 1\n";
        let out = merge(&[h, other, h]);
        assert_eq!(
            out,
            "# HELP h Latency.\n# TYPE h histogram\nh_bucket{le=\"0.1\"} 2\n\
             h_bucket{le=\"+Inf\"} 4\nh_sum 1\nh_count 4\n\
             # HELP h_count_total Not part of h.\n# TYPE h_count_total counter\nh_count_total 1\n"
        );
    }

    #[test]
    fn values_keep_their_text_form() {
        let out = merge(&["a 0.25\nb +Inf\nc 12345678901\nbad line\n"]);
        assert_eq!(out, "a 0.25\nb +Inf\nc 12345678901\n");
    }
}
