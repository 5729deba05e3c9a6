//! A key's settings as the admin API and the state store see them: allow-list, limits, budget,
//! expiry, enabled — read from JSON (create and patch bodies, stored rows) with every field
//! checked by the same rules as `[[key]]`, written back as JSON, and compiled into a `Key`.
//!
//! Owns: `KeySpec`, its JSON form and its validation. Must not: see a secret or a digest (that
//! is `registry` and `keyring`), or be used on the request path.

use serde_json::{Map, Value};

use super::keyring::{Key, ModelRule};
use super::spend::{usd_to_nanos, Period};
use crate::config::keys::{parse_rfc3339, KeyConfig};
use crate::http::target;

/// The settings of one key (not its name or secret).
#[derive(Debug, Clone, PartialEq)]
pub struct KeySpec {
    /// `None`: every model. Entries are names or `prefix*`.
    pub models: Option<Vec<String>>,
    pub rpm: Option<u64>,
    pub tpm: Option<u64>,
    pub max_in_flight: Option<u64>,
    pub budget_usd: Option<f64>,
    /// `day` | `month` | `total`.
    pub budget_period: Option<String>,
    /// Unix seconds.
    pub expires: Option<i64>,
    pub enabled: bool,
    /// `None`: every MCP tool. Entries are globs over `server__tool` names.
    pub mcp_tools: Option<Vec<String>>,
}

impl Default for KeySpec {
    fn default() -> Self {
        KeySpec {
            models: None,
            rpm: None,
            tpm: None,
            max_in_flight: None,
            budget_usd: None,
            budget_period: None,
            expires: None,
            enabled: true,
            mcp_tools: None,
        }
    }
}

/// The fields `apply` accepts (besides `name`, which the caller handles).
pub const FIELDS: [&str; 9] = [
    "models",
    "rpm",
    "tpm",
    "max_in_flight",
    "budget_usd",
    "budget_period",
    "expires",
    "enabled",
    "mcp_tools",
];

impl KeySpec {
    /// The settings of a `[[key]]` (assumed validated).
    pub fn from_config(k: &KeyConfig) -> KeySpec {
        KeySpec {
            models: k
                .models
                .as_ref()
                .map(|ms| ms.iter().map(|m| m.get_ref().clone()).collect()),
            rpm: k.rpm.as_ref().map(|v| *v.get_ref()),
            tpm: k.tpm.as_ref().map(|v| *v.get_ref()),
            max_in_flight: k.max_in_flight.as_ref().map(|v| *v.get_ref()),
            budget_usd: k.budget_usd.as_ref().map(|v| *v.get_ref()),
            budget_period: k.budget_period.as_ref().map(|v| v.get_ref().clone()),
            expires: k.expires_unix().ok().flatten(),
            enabled: k.enabled,
            mcp_tools: k
                .mcp_tools
                .as_ref()
                .map(|ts| ts.iter().map(|t| t.get_ref().clone()).collect()),
        }
    }

    /// Change the fields present in `obj` (`null` clears an optional one); fields not named in
    /// `FIELDS` (other than those in `also`) are refused. On error nothing is changed.
    pub fn apply(&mut self, obj: &Map<String, Value>, also: &[&str]) -> Result<(), String> {
        let mut next = self.clone();
        for (field, v) in obj {
            let f = field.as_str();
            if also.contains(&f) {
                continue;
            }
            match f {
                "models" => next.models = models(v)?,
                "rpm" => next.rpm = limit(f, v)?,
                "tpm" => next.tpm = limit(f, v)?,
                "max_in_flight" => next.max_in_flight = limit(f, v)?,
                "budget_usd" => {
                    next.budget_usd = match v {
                        Value::Null => None,
                        v => Some(
                            v.as_f64()
                                .filter(|b| b.is_finite() && *b >= 0.0)
                                .ok_or("budget_usd must be a number >= 0 or null")?,
                        ),
                    }
                }
                "budget_period" => {
                    next.budget_period = match v {
                        Value::Null => None,
                        Value::String(p) if matches!(p.as_str(), "day" | "month" | "total") => {
                            Some(p.clone())
                        }
                        _ => return Err("budget_period must be \"day\", \"month\" or \"total\"".into()),
                    }
                }
                "expires" => {
                    next.expires = match v {
                        Value::Null => None,
                        Value::String(s) => Some(parse_rfc3339(s)?),
                        _ => {
                            return Err(
                                "expires must be an RFC 3339 time with an offset (e.g. 2026-01-31T23:59:59Z) or null"
                                    .into(),
                            )
                        }
                    }
                }
                "enabled" => next.enabled = v.as_bool().ok_or("enabled must be true or false")?,
                "mcp_tools" => next.mcp_tools = mcp_tools(v)?,
                other => {
                    return Err(format!(
                        "unknown field {other:?}; expected {}",
                        FIELDS.join(", ")
                    ))
                }
            }
        }
        *self = next;
        Ok(())
    }

    /// The JSON fields of these settings (added to `out`).
    pub fn write(&self, out: &mut Map<String, Value>) {
        out.insert(
            "models".into(),
            self.models.as_ref().map_or(Value::Null, |m| {
                m.iter().cloned().map(Value::from).collect()
            }),
        );
        for (f, v) in [
            ("rpm", self.rpm),
            ("tpm", self.tpm),
            ("max_in_flight", self.max_in_flight),
        ] {
            out.insert(f.into(), v.map_or(Value::Null, Value::from));
        }
        out.insert(
            "budget_usd".into(),
            self.budget_usd.map_or(Value::Null, Value::from),
        );
        out.insert(
            "budget_period".into(),
            self.budget_period.clone().map_or(Value::Null, Value::from),
        );
        out.insert(
            "expires".into(),
            self.expires
                .map_or(Value::Null, |t| Value::from(crate::util::date::rfc3339(t))),
        );
        out.insert("enabled".into(), Value::from(self.enabled));
        out.insert(
            "mcp_tools".into(),
            self.mcp_tools.as_ref().map_or(Value::Null, |m| {
                m.iter().cloned().map(Value::from).collect()
            }),
        );
    }

    /// The JSON object of these settings (stored rows).
    pub fn to_json(&self) -> String {
        let mut m = Map::new();
        self.write(&mut m);
        Value::Object(m).to_string()
    }

    /// Settings from a stored row's JSON.
    pub fn from_json(text: &str) -> Result<KeySpec, String> {
        let v: Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
        let obj = v.as_object().ok_or("not a JSON object")?;
        let mut spec = KeySpec::default();
        spec.apply(obj, &[])?;
        Ok(spec)
    }

    /// The compiled key named `name`.
    pub fn compile(&self, name: &str) -> Key {
        Key {
            name: name.into(),
            models: self.models.as_ref().map(|ms| {
                ms.iter()
                    .map(|m| match m.strip_suffix('*') {
                        Some(p) => ModelRule::Prefix(p.into()),
                        None => ModelRule::Exact(m.as_str().into()),
                    })
                    .collect()
            }),
            rpm: self.rpm,
            tpm: self.tpm,
            max_in_flight: self.max_in_flight,
            expires: self.expires,
            enabled: self.enabled,
            budget_nanos: self.budget_usd.map(usd_to_nanos),
            period: self
                .budget_period
                .as_deref()
                .and_then(Period::parse)
                .unwrap_or(Period::Total),
            mcp_tools: self
                .mcp_tools
                .as_ref()
                .map(|ts| ts.iter().map(|t| t.as_str().into()).collect()),
        }
    }
}

/// A `field` of patterns, each checked by `rule`: `null` (no restriction) or a list of at most
/// 1024 strings; `every` names what `null` allows in the error.
fn patterns(
    field: &str,
    every: &str,
    v: &Value,
    rule: impl Fn(&str) -> Result<(), &'static str>,
) -> Result<Option<Vec<String>>, String> {
    let list = match v {
        Value::Null => return Ok(None),
        Value::Array(a) => a,
        _ => return Err(format!("{field} must be a list of {every}")),
    };
    if list.len() > 1024 {
        return Err(format!("{field}: at most 1024 entries"));
    }
    let mut out = Vec::with_capacity(list.len());
    for p in list {
        let Some(pat) = p.as_str() else {
            return Err(format!("{field} entries must be strings"));
        };
        rule(pat).map_err(|why| format!("{field} entry {pat:?} {why}"))?;
        out.push(pat.to_string());
    }
    Ok(Some(out))
}

fn mcp_tools(v: &Value) -> Result<Option<Vec<String>>, String> {
    let every = "tool name globs (or null for every tool)";
    patterns("mcp_tools", every, v, crate::config::keys::mcp_tool_pattern)
}

fn limit(field: &str, v: &Value) -> Result<Option<u64>, String> {
    match v {
        Value::Null => Ok(None),
        v => v
            .as_u64()
            .filter(|n| *n >= 1)
            .map(Some)
            .ok_or(format!("{field} must be a whole number >= 1 or null")),
    }
}

fn models(v: &Value) -> Result<Option<Vec<String>>, String> {
    let every = "model names (or null for every model)";
    patterns("models", every, v, |pat| match pat.strip_suffix('*') {
        Some(prefix) if !prefix.is_empty() => target::model_prefix(prefix),
        Some(_) => Ok(()),
        None => target::model_id(pat),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(text: &str) -> Map<String, Value> {
        serde_json::from_str(text).unwrap()
    }

    #[test]
    fn apply_checks_every_field_and_changes_nothing_on_error() {
        let mut s = KeySpec::default();
        s.apply(
            &obj(r#"{"name":"x","models":["gpt-4o-mini","claude-*"],"rpm":60,"budget_usd":5,"budget_period":"month","expires":"2001-09-09T03:46:40+02:00","enabled":false}"#),
            &["name"],
        )
        .unwrap();
        assert_eq!(s.rpm, Some(60));
        assert_eq!(s.expires, Some(1_000_000_000));
        assert!(!s.enabled);
        let k = s.compile("x");
        assert!(k.allows("claude-3") && !k.allows("gpt-4o"));
        let before = s.clone();
        for bad in [
            r#"{"rpm":0}"#,
            r#"{"rpm":-1}"#,
            r#"{"tpm":"5"}"#,
            r#"{"models":"gpt"}"#,
            r#"{"models":["a b"]}"#,
            r#"{"budget_usd":-1}"#,
            r#"{"budget_period":"week"}"#,
            r#"{"expires":"tomorrow"}"#,
            r#"{"enabled":1}"#,
            r#"{"rpm":5,"secret":"x"}"#,
        ] {
            assert!(s.apply(&obj(bad), &[]).is_err(), "{bad}");
            assert_eq!(s, before, "{bad}");
        }
        s.apply(&obj(r#"{"rpm":null,"models":null}"#), &[]).unwrap();
        assert_eq!((s.rpm, s.models.clone()), (None, None));
        assert_eq!(KeySpec::from_json(&s.to_json()).unwrap(), s);
    }
}
