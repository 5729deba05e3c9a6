//! Byte sizes as written by operators: parsing `"64MiB"`, `"32MB"`, `"2G"`, `1048576`.
//!
//! Owns: the size grammar ([`parse_size`]) and the serde newtype [`ByteSize`] that accepts either a
//! string or an integer in config files.
//! Must not: read files, know about budgets, or apply defaults/limits (callers do that).
//!
//! Grammar: optional whitespace, a non-negative number (integer or decimal such as `1.5`), optional
//! whitespace, an optional case-insensitive unit:
//!
//! | unit                         | multiplier |
//! |------------------------------|------------|
//! | (none), `b`                  | 1          |
//! | `k`, `ki`, `kib`             | 2^10       |
//! | `m`, `mi`, `mib`             | 2^20       |
//! | `g`, `gi`, `gib`             | 2^30       |
//! | `t`, `ti`, `tib`             | 2^40       |
//! | `kb`, `mb`, `gb`, `tb`       | 10^3 .. 10^12 (SI) |
//!
//! Single-letter units are binary, as in nginx and the JVM (`2G` = 2 GiB); the two-letter `..B`
//! forms are SI. Fractional results are truncated to whole bytes. Overflow is an error.

use serde::de::{self, Deserialize, Deserializer, Visitor};
use std::fmt;

/// Parses a human byte size. See the module docs for the grammar.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    if t.is_empty() {
        return Err("empty size".to_string());
    }
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let unit = unit.trim();
    if num.is_empty() {
        return Err(format!("size {s:?} does not start with a number"));
    }
    let mult = unit_multiplier(unit).ok_or_else(|| {
        format!("size {s:?}: unknown unit {unit:?} (use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)")
    })?;
    match num.split_once('.') {
        None => {
            let n: u64 = num
                .parse()
                .map_err(|_| format!("size {s:?}: bad number {num:?}"))?;
            n.checked_mul(mult)
                .ok_or_else(|| format!("size {s:?} overflows 64 bits"))
        }
        Some((int, frac)) => {
            if frac.contains('.') || (int.is_empty() && frac.is_empty()) {
                return Err(format!("size {s:?}: bad number {num:?}"));
            }
            let int_part: u64 = if int.is_empty() {
                0
            } else {
                int.parse()
                    .map_err(|_| format!("size {s:?}: bad number {num:?}"))?
            };
            let whole = int_part
                .checked_mul(mult)
                .ok_or_else(|| format!("size {s:?} overflows 64 bits"))?;
            // Fraction: at most 9 digits are significant; extra digits are ignored.
            let digits: String = frac.chars().take(9).collect();
            let mut scale: u128 = 1;
            for _ in 0..digits.len() {
                scale *= 10;
            }
            let frac_val: u128 = if digits.is_empty() {
                0
            } else {
                digits
                    .parse()
                    .map_err(|_| format!("size {s:?}: bad number {num:?}"))?
            };
            let extra = u64::try_from(frac_val * u128::from(mult) / scale)
                .map_err(|_| format!("size {s:?} overflows 64 bits"))?;
            whole
                .checked_add(extra)
                .ok_or_else(|| format!("size {s:?} overflows 64 bits"))
        }
    }
}

fn unit_multiplier(unit: &str) -> Option<u64> {
    let u = unit.to_ascii_lowercase();
    let m = match u.as_str() {
        "" | "b" => 1,
        "k" | "ki" | "kib" => 1 << 10,
        "m" | "mi" | "mib" => 1 << 20,
        "g" | "gi" | "gib" => 1 << 30,
        "t" | "ti" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        _ => return None,
    };
    Some(m)
}

/// A byte count that deserializes from an integer (`1048576`) or a size string (`"1MiB"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct ByteSize(pub u64);

impl ByteSize {
    /// The number of bytes.
    pub fn bytes(self) -> u64 {
        self.0
    }
}

impl fmt::Display for ByteSize {
    /// Renders the largest exact binary unit (`64MiB`), else plain bytes.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0;
        for (shift, unit) in [(40u32, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")] {
            let m = 1u64 << shift;
            if n != 0 && n % m == 0 {
                return write!(f, "{}{unit}", n / m);
            }
        }
        write!(f, "{n}")
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = ByteSize;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a byte size such as 1048576, \"64MiB\" or \"2G\"")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<ByteSize, E> {
                Ok(ByteSize(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<ByteSize, E> {
                u64::try_from(v)
                    .map(ByteSize)
                    .map_err(|_| E::custom("byte size must not be negative"))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ByteSize, E> {
                parse_size(v).map(ByteSize).map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units() {
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("32MB"), Ok(32_000_000));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("512KiB"), Ok(512 << 10));
        assert_eq!(parse_size("1048576"), Ok(1_048_576));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert_eq!(parse_size("2g"), Ok(2 << 30));
        assert_eq!(parse_size(" 16 mib "), Ok(16 << 20));
        assert_eq!(parse_size("100B"), Ok(100));
        assert_eq!(parse_size("4Ki"), Ok(4096));
        assert_eq!(parse_size("1TiB"), Ok(1 << 40));
        assert_eq!(parse_size("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_size("0.5k"), Ok(512));
        assert_eq!(parse_size(".5k"), Ok(512));
        assert_eq!(parse_size("0"), Ok(0));
    }

    #[test]
    fn rejects_garbage() {
        for bad in [
            "",
            " ",
            "MiB",
            "-1",
            "1.2.3",
            "12XB",
            "1 2",
            ".",
            "99999999999999999999",
            "20000000TiB",
            "1e9",
        ] {
            assert!(parse_size(bad).is_err(), "{bad:?} should fail");
        }
    }

    #[test]
    fn display_round_trips() {
        for n in [0u64, 1, 1000, 1024, 64 << 20, 3 << 30, (1 << 40) + 1] {
            let s = ByteSize(n).to_string();
            assert_eq!(parse_size(&s), Ok(n), "{s}");
        }
    }

    #[derive(serde::Deserialize)]
    struct Holder {
        a: ByteSize,
        b: ByteSize,
    }

    #[test]
    fn deserializes_int_or_string() {
        let h: Holder = toml::from_str("a = 1024\nb = \"2MiB\"").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(h.a, ByteSize(1024));
        assert_eq!(h.b, ByteSize(2 << 20));
        assert!(toml::from_str::<Holder>("a = -1\nb = 1").is_err());
        assert!(toml::from_str::<Holder>("a = \"lots\"\nb = 1").is_err());
    }
}
