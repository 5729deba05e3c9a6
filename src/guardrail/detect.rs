//! The built-in detectors: what each `detect = [...]` name matches, as linear-time regular
//! expressions with bounded repetitions (so every match has a known longest length, the
//! stream hold-back), and the check a candidate must pass (`checks`).
//!
//! Owns: `Kind` (the detector types and their labels), the built-in patterns. Must not: hold
//! state or see configuration beyond a detector's name.

use super::checks::Check;

/// A detector type: what metrics (`type`) and the mask text (`{TYPE}`) call a match.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Email,
    Phone,
    CreditCard,
    Iban,
    UsSsn,
    Ipv4,
    Secret,
    Pattern,
    Word,
}

impl Kind {
    /// The metric label and the name in messages (`email`, `credit_card`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Kind::Email => "email",
            Kind::Phone => "phone",
            Kind::CreditCard => "credit_card",
            Kind::Iban => "iban",
            Kind::UsSsn => "us_ssn",
            Kind::Ipv4 => "ipv4",
            Kind::Secret => "secrets",
            Kind::Pattern => "pattern",
            Kind::Word => "word",
        }
    }

    /// `{TYPE}` in the mask text.
    pub fn label(self) -> &'static str {
        match self {
            Kind::Email => "EMAIL",
            Kind::Phone => "PHONE",
            Kind::CreditCard => "CREDIT_CARD",
            Kind::Iban => "IBAN",
            Kind::UsSsn => "US_SSN",
            Kind::Ipv4 => "IPV4",
            Kind::Secret => "SECRET",
            Kind::Pattern => "PATTERN",
            Kind::Word => "WORD",
        }
    }

    pub const ALL: [Kind; 9] = [
        Kind::Email,
        Kind::Phone,
        Kind::CreditCard,
        Kind::Iban,
        Kind::UsSsn,
        Kind::Ipv4,
        Kind::Secret,
        Kind::Pattern,
        Kind::Word,
    ];
}

/// One built-in detector: its type, pattern and the check its candidates must pass.
pub struct Builtin {
    pub kind: Kind,
    pub pattern: &'static str,
    pub check: Check,
}

/// ASCII word boundary (the DFA that finds live stream positions handles it on any text).
macro_rules! b {
    () => {
        r"(?-u:\b)"
    };
}

/// `$re` as a whole word (between ASCII word boundaries).
macro_rules! word {
    ($re:literal) => {
        concat!(b!(), $re, b!())
    };
}

const EMAIL: &str = word!(
    r"[A-Za-z0-9._%+\-]{1,64}@[A-Za-z0-9\-]{1,63}(?:\.[A-Za-z0-9\-]{1,63}){0,4}\.[A-Za-z]{2,24}"
);

/// International (`+49 151 1234 5678`), North American (`(415) 555-2671`, `415-555-2671`) and
/// common European national formats (`030 1234 5678`); 8 to 15 digits.
const PHONE: &str = concat!(
    r"(?:\+[1-9][0-9]{0,2}(?:[ .\-]?\(?[0-9]{1,4}\)?){2,5}",
    r"|\([0-9]{3}\)[ .\-]?[0-9]{3}[ .\-][0-9]{4}",
    r"|",
    b!(),
    r"[0-9]{3}[ .\-][0-9]{3}[ .\-][0-9]{4}",
    r"|",
    b!(),
    r"0[1-9][0-9]{1,3}[ /\-][0-9]{3,4}[ \-]?[0-9]{3,4})",
    b!()
);

/// 13–19 digits, optionally grouped by spaces or dashes; Luhn-checked.
const CARD: &str = word!(r"[0-9](?:[ \-]?[0-9]){12,18}");

/// Country, check digits, 11–30 alphanumerics (optionally grouped); mod-97-checked.
const IBAN: &str = word!(r"[A-Z]{2}[0-9]{2}(?: ?[A-Z0-9]){11,30}");

const SSN: &str = word!(r"[0-9]{3}[- ][0-9]{2}[- ][0-9]{4}");

const IPV4: &str = word!(
    r"(?:(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])\.){3}(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
);

/// Provider API keys, JWTs and PEM private-key blocks.
const SECRETS: &str = concat!(
    r"(?:sk-ant-[A-Za-z0-9_\-]{20,200}",
    r"|sk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_\-]{20,200}",
    r"|(?:AKIA|ASIA|ABIA|ACCA)[0-9A-Z]{16}",
    r"|(?i:aws_?secret_?access_?key)[\x22']?[ \t]{0,3}[:=][ \t]{0,3}[\x22']?[A-Za-z0-9/+=]{40}",
    r"|(?:ghp|gho|ghs|ghu|ghr)_[A-Za-z0-9]{36,255}",
    r"|github_pat_[A-Za-z0-9_]{22,255}",
    r"|xox[abposr]-[A-Za-z0-9\-]{10,250}",
    r"|AIza[0-9A-Za-z_\-]{35}",
    r"|eyJ[A-Za-z0-9_\-]{5,1024}\.eyJ[A-Za-z0-9_\-]{5,2048}\.[A-Za-z0-9_\-]{0,1024}",
    r"|-----BEGIN (?:[A-Z0-9]{1,10} ){0,2}PRIVATE KEY-----[A-Za-z0-9+/=\r\n\t :,\-]{0,4800}?",
    r"-----END (?:[A-Z0-9]{1,10} ){0,2}PRIVATE KEY-----)"
);

/// The built-in detector called `name` in `detect = [...]`.
pub fn builtin(name: &str) -> Option<Builtin> {
    let (kind, pattern, check) = match name {
        "email" => (Kind::Email, EMAIL, Check::None),
        "phone" => (Kind::Phone, PHONE, Check::PhoneDigits),
        "credit_card" => (Kind::CreditCard, CARD, Check::Luhn),
        "iban" => (Kind::Iban, IBAN, Check::Iban),
        "us_ssn" => (Kind::UsSsn, SSN, Check::Ssn),
        "ipv4" => (Kind::Ipv4, IPV4, Check::None),
        "secrets" => (Kind::Secret, SECRETS, Check::None),
        _ => return None,
    };
    Some(Builtin {
        kind,
        pattern,
        check,
    })
}

/// Every name `detect` accepts.
pub const NAMES: [&str; 7] = [
    "email",
    "phone",
    "credit_card",
    "iban",
    "us_ssn",
    "ipv4",
    "secrets",
];
