//! The cloud provider kinds' fields (`kind = "bedrock"`: `region`, `role_arn`, `sts_url`;
//! `kind = "vertex"`: `project`, `location`, `credentials_file`, `token_url`, `publisher`):
//! their checks and the endpoints they imply when `base_url` is not given.
//!
//! Owns: `check`, `base_url`. Must not: read credentials or open sockets.

use std::ops::Range;

use crate::config::provider::ProviderKind;
use crate::config::ProviderConfig;

/// A region, project or location: it becomes part of a host name or a path.
fn name_ok(v: &str) -> bool {
    !v.is_empty()
        && v.len() <= 63
        && v.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        && !v.starts_with('-')
}

/// The problems of `p`'s cloud fields (`err(span, message)`).
pub fn check(p: &ProviderConfig, name: &str, err: &mut dyn FnMut(Range<usize>, String)) {
    let kind = *p.kind.get_ref();
    let mut field = |f: &Option<toml::Spanned<String>>, what: &str, needed: bool| match f {
        Some(v) if !name_ok(v.get_ref()) => err(
            v.span(),
            format!(
                "provider {name:?}: {what} {:?} must be letters, digits and '-'",
                v.get_ref()
            ),
        ),
        None if needed => err(
            p.name.span(),
            format!("provider {name:?}: kind {} needs {what}", kind.as_str()),
        ),
        _ => {}
    };
    let bedrock = kind == ProviderKind::Bedrock;
    let vertex = kind == ProviderKind::Vertex;
    field(&p.region, "region", bedrock);
    field(&p.project, "project", vertex);
    field(&p.location, "location", vertex);
    let only = |f: bool, k: bool, what: &str, err: &mut dyn FnMut(Range<usize>, String)| {
        if f && !k {
            err(
                p.name.span(),
                format!(
                    "provider {name:?}: {what} is only for kind {}",
                    if what == "region" || what == "role_arn" || what == "sts_url" {
                        "bedrock"
                    } else {
                        "vertex"
                    }
                ),
            );
        }
    };
    only(p.region.is_some(), bedrock, "region", err);
    only(p.role_arn.is_some(), bedrock, "role_arn", err);
    only(p.sts_url.is_some(), bedrock, "sts_url", err);
    only(p.project.is_some(), vertex, "project", err);
    only(p.location.is_some(), vertex, "location", err);
    only(
        p.credentials_file.is_some(),
        vertex,
        "credentials_file",
        err,
    );
    only(p.token_url.is_some(), vertex, "token_url", err);
    only(p.publisher.is_some(), vertex, "publisher", err);
    for (f, what) in [(&p.sts_url, "sts_url"), (&p.token_url, "token_url")] {
        if let Some(u) = f {
            let v = u.get_ref();
            let ok = (v.starts_with("http://") || v.starts_with("https://"))
                && crate::http::target::header_value(v).is_ok()
                && !v.contains(' ');
            if !ok {
                err(
                    u.span(),
                    format!("provider {name:?}: {what} must be an http:// or https:// URL"),
                );
            }
        }
    }
    if let Some(a) = &p.role_arn {
        if !a.get_ref().starts_with("arn:")
            || crate::http::target::header_value(a.get_ref()).is_err()
        {
            err(
                a.span(),
                format!("provider {name:?}: role_arn must be an arn:… role ARN"),
            );
        }
    }
}

/// The endpoint URL of a cloud provider: its `base_url` (Vertex: plus the project path), else
/// the public one. `None` for other kinds or missing fields.
pub fn base_url(p: &ProviderConfig) -> Option<String> {
    let given = p
        .base_url
        .as_ref()
        .map(|u| u.get_ref().trim_end_matches('/').to_string());
    match p.kind.get_ref() {
        ProviderKind::Bedrock => Some(given.unwrap_or_else(|| {
            let region = p
                .region
                .as_ref()
                .map_or("us-east-1", |r| r.get_ref().as_str());
            format!("https://bedrock-runtime.{region}.amazonaws.com")
        })),
        ProviderKind::Vertex => {
            let project = p.project.as_ref()?.get_ref();
            let location = p.location.as_ref()?.get_ref();
            let host = given.unwrap_or_else(|| {
                if location == "global" {
                    "https://aiplatform.googleapis.com".to_string()
                } else {
                    format!("https://{location}-aiplatform.googleapis.com")
                }
            });
            Some(format!("{host}/v1/projects/{project}/locations/{location}"))
        }
        _ => None,
    }
}

/// The STS endpoint of a Bedrock provider.
pub fn sts_url(p: &ProviderConfig) -> String {
    match &p.sts_url {
        Some(u) => u.get_ref().clone(),
        None => {
            let region = p
                .region
                .as_ref()
                .map_or("us-east-1", |r| r.get_ref().as_str());
            format!("https://sts.{region}.amazonaws.com")
        }
    }
}
