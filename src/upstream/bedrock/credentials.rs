//! The AWS credential chain, in the SDKs' order, resolved on a helper thread (never on a
//! shard): environment (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`) →
//! web identity (`AWS_WEB_IDENTITY_TOKEN_FILE` + `AWS_ROLE_ARN` → STS
//! `AssumeRoleWithWebIdentity`) → the shared files (`AWS_SHARED_CREDENTIALS_FILE`,
//! `AWS_CONFIG_FILE`, `~/.aws/…`; profile `AWS_PROFILE`, else `default`: static keys,
//! `role_arn` + `source_profile` or `credential_source` → STS `AssumeRole`, `role_arn` +
//! `web_identity_token_file`) → container credentials (`AWS_CONTAINER_CREDENTIALS_FULL_URI` or
//! `…_RELATIVE_URI`, with `AWS_CONTAINER_AUTHORIZATION_TOKEN[_FILE]`) → IMDSv2
//! (`AWS_EC2_METADATA_SERVICE_ENDPOINT`, default `http://169.254.169.254`; off with
//! `AWS_EC2_METADATA_DISABLED=true`). A provider's `role_arn` is then assumed with what the
//! chain found (STS `AssumeRole`, signed with SigV4; `sts_url` overridable).
//!
//! Owns: `resolve` and its sources. Must not: run on a shard (it blocks on files and HTTP), or
//! put a secret in an error message or a log line.

use super::sigv4::{self, Credentials};
use crate::upstream::fetch::{self, form_value};

/// What a provider's chain needs besides the environment.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Source {
    pub region: String,
    pub role_arn: Option<String>,
    pub sts_url: String,
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Resolve credentials now (blocking): the chain, then the provider's `role_arn`.
pub fn resolve(src: &Source) -> Result<Credentials, String> {
    let base = chain(src)?;
    match &src.role_arn {
        Some(arn) => assume_role(src, &base, arn),
        None => Ok(base),
    }
}

fn chain(src: &Source) -> Result<Credentials, String> {
    if let (Some(id), Some(secret)) = (env("AWS_ACCESS_KEY_ID"), env("AWS_SECRET_ACCESS_KEY")) {
        return Ok(Credentials {
            access_key_id: id,
            secret_access_key: secret,
            session_token: env("AWS_SESSION_TOKEN"),
            expires: None,
        });
    }
    if let (Some(file), Some(arn)) = (env("AWS_WEB_IDENTITY_TOKEN_FILE"), env("AWS_ROLE_ARN")) {
        return web_identity(src, &file, &arn, env("AWS_ROLE_SESSION_NAME"));
    }
    let profile = env("AWS_PROFILE").unwrap_or_else(|| "default".into());
    if let Some(c) = from_profile(src, &profile, 0)? {
        return Ok(c);
    }
    if let Some(c) = container()? {
        return Ok(c);
    }
    if env("AWS_EC2_METADATA_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
        return Err("no AWS credentials: none in the environment, the shared files or the container endpoint (IMDS is disabled)".into());
    }
    imds().map_err(|e| {
        format!("no AWS credentials: none in the environment, the shared files or the container endpoint; IMDS: {e}")
    })
}

// ------------------------------------------------------------------ shared files

/// `key = value` pairs of section `[name]` of an INI text.
fn section(text: &str, name: &str) -> Option<Vec<(String, String)>> {
    let mut found = None;
    let mut cur: Option<Vec<(String, String)>> = None;
    for line in text.lines() {
        let l = line.trim();
        if l.is_empty() || l.starts_with('#') || l.starts_with(';') {
            continue;
        }
        if let Some(h) = l.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
            if let Some(done) = cur.take() {
                found = Some(done);
            }
            if h.trim() == name {
                cur = Some(Vec::new());
            }
            continue;
        }
        if let (Some(c), Some((k, v))) = (cur.as_mut(), l.split_once('=')) {
            c.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    cur.or(found)
}

fn home_file(var: &str, rel: &str) -> Option<String> {
    env(var).or_else(|| env("HOME").map(|h| format!("{h}/.aws/{rel}")))
}

/// The settings of `profile` from both files (credentials file first, as the SDKs merge).
fn profile_settings(profile: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    if let Some(t) = home_file("AWS_SHARED_CREDENTIALS_FILE", "credentials")
        .and_then(|f| std::fs::read_to_string(f).ok())
    {
        out.extend(section(&t, profile).unwrap_or_default());
    }
    if let Some(t) =
        home_file("AWS_CONFIG_FILE", "config").and_then(|f| std::fs::read_to_string(f).ok())
    {
        let name = if profile == "default" {
            "default".to_string()
        } else {
            format!("profile {profile}")
        };
        let s = section(&t, &name).or_else(|| section(&t, profile));
        out.extend(s.unwrap_or_default());
    }
    out
}

fn from_profile(src: &Source, profile: &str, depth: u8) -> Result<Option<Credentials>, String> {
    if depth > 4 {
        return Err(format!(
            "AWS profile {profile}: source_profile chain too deep"
        ));
    }
    let set = profile_settings(profile);
    let get = |k: &str| {
        set.iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.clone())
            .filter(|v| !v.is_empty())
    };
    if let Some(arn) = get("role_arn") {
        if let Some(file) = get("web_identity_token_file") {
            return web_identity(src, &file, &arn, get("role_session_name")).map(Some);
        }
        let base = if let Some(sp) = get("source_profile") {
            if sp == profile {
                static_keys(&get)
            } else {
                from_profile(src, &sp, depth + 1)?
            }
            .ok_or_else(|| {
                format!("AWS profile {profile}: source_profile {sp} has no credentials")
            })?
        } else {
            match get("credential_source").as_deref() {
                Some("Environment") => match (env("AWS_ACCESS_KEY_ID"), env("AWS_SECRET_ACCESS_KEY")) {
                    (Some(id), Some(secret)) => Credentials {
                        access_key_id: id,
                        secret_access_key: secret,
                        session_token: env("AWS_SESSION_TOKEN"),
                        expires: None,
                    },
                    _ => return Err(format!("AWS profile {profile}: credential_source Environment, but no keys in the environment")),
                },
                Some("EcsContainer") => container()?
                    .ok_or_else(|| format!("AWS profile {profile}: no container credentials endpoint"))?,
                Some("Ec2InstanceMetadata") => imds()?,
                _ => {
                    return Err(format!(
                        "AWS profile {profile}: role_arn needs source_profile or credential_source"
                    ))
                }
            }
        };
        return assume_role(src, &base, &arn).map(Some);
    }
    Ok(static_keys(&get))
}

fn static_keys(get: &dyn Fn(&str) -> Option<String>) -> Option<Credentials> {
    Some(Credentials {
        access_key_id: get("aws_access_key_id")?,
        secret_access_key: get("aws_secret_access_key")?,
        session_token: get("aws_session_token"),
        expires: None,
    })
}

// ------------------------------------------------------------------ STS

fn sts_fields(xml: &str) -> Result<Credentials, String> {
    let tag = |t: &str| {
        let open = format!("<{t}>");
        let close = format!("</{t}>");
        let a = xml.find(&open)? + open.len();
        let b = xml[a..].find(&close)? + a;
        Some(xml_unescape(xml[a..b].trim()))
    };
    let c = Credentials {
        access_key_id: tag("AccessKeyId").ok_or("STS answer without AccessKeyId")?,
        secret_access_key: tag("SecretAccessKey").ok_or("STS answer without SecretAccessKey")?,
        session_token: tag("SessionToken"),
        expires: tag("Expiration").and_then(|e| parse_time(&e)),
    };
    Ok(c)
}

fn xml_unescape(s: &str) -> String {
    s.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&amp;", "&")
}

fn sts_call(src: &Source, form: &str, signer: Option<&Credentials>) -> Result<Credentials, String> {
    let u = fetch::parse_url(&src.sts_url)?;
    let mut target = u.target.to_string();
    if target.is_empty() {
        target.push('/');
    }
    let mut headers = b"content-type: application/x-www-form-urlencoded; charset=utf-8\r\naccept: application/xml\r\n".to_vec();
    if let Some(c) = signer {
        let date = sigv4::amz_date(now());
        headers.extend(sigv4::sign(
            c,
            &sigv4::Request {
                region: &src.region,
                service: "sts",
                host: u.authority,
                target: &target,
                body: form.as_bytes(),
                amz_date: &date,
            },
        ));
    }
    let r = fetch::fetch("POST", &src.sts_url, &headers, form.as_bytes())?;
    let text = String::from_utf8_lossy(&r.body);
    if r.status != 200 {
        // STS error bodies name the code and message, never a credential
        let code = text
            .split("<Code>")
            .nth(1)
            .and_then(|t| t.split("</Code>").next())
            .unwrap_or("");
        return Err(format!("STS answered {} {code}", r.status));
    }
    sts_fields(&text)
}

fn session_name(given: Option<String>) -> String {
    given.unwrap_or_else(|| format!("ringgate-{}", now()))
}

fn web_identity(
    src: &Source,
    file: &str,
    arn: &str,
    session: Option<String>,
) -> Result<Credentials, String> {
    let token = std::fs::read_to_string(file)
        .map_err(|e| format!("web identity token file {file}: {e}"))?;
    let mut form = String::from("Action=AssumeRoleWithWebIdentity&Version=2011-06-15&RoleArn=");
    form_value(arn, &mut form);
    form.push_str("&RoleSessionName=");
    form_value(&session_name(session), &mut form);
    form.push_str("&WebIdentityToken=");
    form_value(token.trim(), &mut form);
    sts_call(src, &form, None).map_err(|e| format!("AssumeRoleWithWebIdentity {arn}: {e}"))
}

fn assume_role(src: &Source, base: &Credentials, arn: &str) -> Result<Credentials, String> {
    let mut form = String::from("Action=AssumeRole&Version=2011-06-15&RoleArn=");
    form_value(arn, &mut form);
    form.push_str("&RoleSessionName=");
    form_value(&session_name(None), &mut form);
    sts_call(src, &form, Some(base)).map_err(|e| format!("AssumeRole {arn}: {e}"))
}

// ------------------------------------------------------------------ container, IMDS

fn json_creds(body: &[u8]) -> Result<Credentials, String> {
    let v: serde_json::Value =
        serde_json::from_slice(body).map_err(|_| "the credentials answer is not JSON")?;
    let s = |k: &str| v.get(k).and_then(|x| x.as_str()).map(str::to_string);
    Ok(Credentials {
        access_key_id: s("AccessKeyId").ok_or("no AccessKeyId in the credentials answer")?,
        secret_access_key: s("SecretAccessKey")
            .ok_or("no SecretAccessKey in the credentials answer")?,
        session_token: s("Token"),
        expires: s("Expiration").and_then(|e| parse_time(&e)),
    })
}

fn container() -> Result<Option<Credentials>, String> {
    let url = match (
        env("AWS_CONTAINER_CREDENTIALS_FULL_URI"),
        env("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI"),
    ) {
        (Some(full), _) => full,
        (None, Some(rel)) => format!("http://169.254.170.2{rel}"),
        (None, None) => return Ok(None),
    };
    let token = match env("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE") {
        Some(f) => Some(
            std::fs::read_to_string(&f)
                .map_err(|e| format!("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE {f}: {e}"))?
                .trim()
                .to_string(),
        ),
        None => env("AWS_CONTAINER_AUTHORIZATION_TOKEN"),
    };
    let mut headers = b"accept: application/json\r\n".to_vec();
    if let Some(t) = token.filter(|t| crate::http::target::header_value(t).is_ok()) {
        headers.extend_from_slice(format!("authorization: {t}\r\n").as_bytes());
    }
    let r = fetch::fetch("GET", &url, &headers, b"")
        .map_err(|e| format!("container credentials: {e}"))?;
    if r.status != 200 {
        return Err(format!(
            "container credentials endpoint answered {}",
            r.status
        ));
    }
    json_creds(&r.body).map(Some)
}

fn imds() -> Result<Credentials, String> {
    let base =
        env("AWS_EC2_METADATA_SERVICE_ENDPOINT").unwrap_or_else(|| "http://169.254.169.254".into());
    let base = base.trim_end_matches('/');
    let t = fetch::fetch(
        "PUT",
        &format!("{base}/latest/api/token"),
        b"x-aws-ec2-metadata-token-ttl-seconds: 21600\r\n",
        b"",
    )?;
    if t.status != 200 {
        return Err(format!("IMDS token: {}", t.status));
    }
    let token = String::from_utf8_lossy(&t.body).trim().to_string();
    crate::http::target::header_value(&token).map_err(|_| "IMDS token is not a header value")?;
    let h = format!("x-aws-ec2-metadata-token: {token}\r\n");
    let path = format!("{base}/latest/meta-data/iam/security-credentials/");
    let r = fetch::fetch("GET", &path, h.as_bytes(), b"")?;
    if r.status != 200 {
        return Err(format!("IMDS role: {}", r.status));
    }
    let role = String::from_utf8_lossy(&r.body);
    let role = role.lines().next().unwrap_or("").trim().to_string();
    if role.is_empty()
        || !role
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"+=,.@_-".contains(&b))
    {
        return Err("IMDS named no usable role".into());
    }
    let r = fetch::fetch("GET", &format!("{path}{role}"), h.as_bytes(), b"")?;
    if r.status != 200 {
        return Err(format!("IMDS credentials: {}", r.status));
    }
    json_creds(&r.body)
}

/// `2026-12-02T10:00:00Z` (fractions and `+00:00` accepted) → Unix seconds.
pub fn parse_time(s: &str) -> Option<u64> {
    let b = s.as_bytes();
    if b.len() < 19 || b[4] != b'-' || b[10] != b'T' {
        return None;
    }
    let n = |r: std::ops::Range<usize>| s.get(r)?.parse::<i64>().ok();
    let days = crate::util::date::days_from_civil(n(0..4)?, n(5..7)?, n(8..10)?);
    let secs = days * 86_400 + n(11..13)? * 3600 + n(14..16)? * 60 + n(17..19)?;
    u64::try_from(secs).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ini_sections_and_times() {
        let t = "[default]\naws_access_key_id = A\n\n[profile dev]\nrole_arn = arn:x\nsource_profile = default\n";
        assert_eq!(
            section(t, "default").unwrap(),
            vec![("aws_access_key_id".into(), "A".into())]
        );
        assert_eq!(section(t, "profile dev").unwrap().len(), 2);
        assert!(section(t, "nope").is_none());
        assert_eq!(parse_time("2026-01-01T00:00:00Z"), Some(1_767_225_600));
        assert_eq!(
            parse_time("2026-01-01T00:00:00.5+00:00"),
            Some(1_767_225_600)
        );
        assert_eq!(parse_time("junk"), None);
    }

    #[test]
    fn sts_answers() {
        let xml = "<AssumeRoleResponse><AssumeRoleResult><Credentials><AccessKeyId>AK</AccessKeyId><SecretAccessKey>S&amp;K</SecretAccessKey><SessionToken>T</SessionToken><Expiration>2026-01-01T00:00:00Z</Expiration></Credentials></AssumeRoleResult></AssumeRoleResponse>";
        let c = sts_fields(xml).unwrap();
        assert_eq!(
            (c.access_key_id.as_str(), c.secret_access_key.as_str()),
            ("AK", "S&K")
        );
        assert_eq!(c.expires, Some(1_767_225_600));
        assert!(sts_fields("<x/>").is_err());
    }
}
