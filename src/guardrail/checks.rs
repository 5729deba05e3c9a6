//! The checks a detector's candidate must pass before it counts as a match: Luhn for card
//! numbers, ISO 7064 mod-97 for IBANs, a digit count for phone numbers, the assigned ranges for
//! US social security numbers.
//!
//! Owns: `Check` and the arithmetic. Must not: allocate or look outside the candidate's text
//! (a candidate's verdict depends on its own bytes only: streams and whole texts agree).

/// What a candidate must pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    None,
    Luhn,
    Iban,
    PhoneDigits,
    Ssn,
}

impl Check {
    /// The end of the accepted match within `cand` (a candidate span's text), or `None`. Cards
    /// and IBANs are tried at every end before a space, longest first (a grouped number
    /// followed by another group of digits is still found).
    pub fn accept(self, cand: &str) -> Option<usize> {
        match self {
            Check::None => Some(cand.len()),
            Check::Luhn => longest_valid(cand, |s| {
                let n = digits(s).count();
                (13..=19).contains(&n) && luhn(s)
            }),
            Check::Iban => longest_valid(cand, iban),
            Check::PhoneDigits => {
                let n = digits(cand).count();
                (8..=15).contains(&n).then_some(cand.len())
            }
            Check::Ssn => ssn(cand).then_some(cand.len()),
        }
    }
}

/// The longest prefix of `cand` ending at its end or before a space that passes `ok`.
fn longest_valid(cand: &str, ok: impl Fn(&str) -> bool) -> Option<usize> {
    let ends = cand
        .char_indices()
        .filter(|&(_, c)| c == ' ')
        .map(|(i, _)| i)
        .chain(std::iter::once(cand.len()));
    let mut ends: smallvec::SmallVec<[usize; 12]> = ends.collect();
    ends.reverse();
    ends.into_iter().find(|&e| cand.get(..e).is_some_and(&ok))
}

fn digits(s: &str) -> impl Iterator<Item = u32> + '_ {
    s.bytes()
        .filter(u8::is_ascii_digit)
        .map(|b| u32::from(b - b'0'))
}

/// The Luhn checksum over the digits of `s` (separators ignored).
pub fn luhn(s: &str) -> bool {
    let mut sum = 0u32;
    let n = digits(s).count();
    for (i, d) in digits(s).enumerate() {
        let double = (n - i) % 2 == 0;
        sum += if double {
            let x = d * 2;
            if x > 9 {
                x - 9
            } else {
                x
            }
        } else {
            d
        };
    }
    n > 0 && sum % 10 == 0
}

/// An IBAN (spaces ignored): 15–34 alphanumerics, two letters, two digits, mod 97 == 1.
pub fn iban(s: &str) -> bool {
    let chars: smallvec::SmallVec<[u8; 36]> = s.bytes().filter(|b| *b != b' ').collect();
    if !(15..=34).contains(&chars.len())
        || !chars.iter().take(2).all(u8::is_ascii_uppercase)
        || !chars.iter().skip(2).take(2).all(u8::is_ascii_digit)
    {
        return false;
    }
    let mut rem = 0u32;
    for &b in chars.iter().skip(4).chain(chars.iter().take(4)) {
        match b {
            b'0'..=b'9' => rem = (rem * 10 + u32::from(b - b'0')) % 97,
            b'A'..=b'Z' => rem = (rem * 100 + u32::from(b - b'A') + 10) % 97,
            _ => return false,
        }
    }
    rem == 1
}

/// `AAA-GG-SSSS` with an assigned area (not 000, 666, 9xx), group and serial.
fn ssn(s: &str) -> bool {
    let d: smallvec::SmallVec<[u32; 16]> = digits(s).collect();
    if d.len() != 9 {
        return false;
    }
    let area = d[0] * 100 + d[1] * 10 + d[2];
    let group = d[3] * 10 + d[4];
    let serial = d[5] * 1000 + d[6] * 100 + d[7] * 10 + d[8];
    area != 0 && area != 666 && area < 900 && group != 0 && serial != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn luhn_and_iban() {
        assert!(luhn("4111 1111 1111 1111"));
        assert!(!luhn("4111 1111 1111 1112"));
        assert!(luhn("5555-5555-5555-4444"));
        assert!(iban("DE89 3704 0044 0532 0130 00"));
        assert!(iban("GB82WEST12345698765432"));
        assert!(!iban("DE88 3704 0044 0532 0130 00"));
        assert!(!iban("de89370400440532013000"));
        assert_eq!(Check::Luhn.accept("4111 1111 1111 1111 123"), Some(19));
        assert_eq!(Check::Luhn.accept("4111111111111112"), None);
        assert_eq!(
            Check::Iban.accept("DE89 3704 0044 0532 0130 00 AND"),
            Some(27)
        );
        assert!(ssn("123-45-6789"));
        assert!(!ssn("666-45-6789"));
        assert!(!ssn("123-00-6789"));
        assert_eq!(Check::PhoneDigits.accept("+1 415"), None);
    }
}
