//! The config of the OpenAI surface beyond chat (`surface`): `[routing] files_provider`, the
//! provider that requests naming no model (files, batches, an id it did not see issued) go to.
//!
//! Owns: which provider kinds serve the surface, the default files provider, and the checks
//! (`files_provider` names a provider of such a kind; several without it is a warning asking
//! for it). Must not: build runtime state.

use std::ops::Range;

use super::provider::ProviderKind;
use super::Config;

type Sink<'e> = dyn FnMut(Range<usize>, String) + 'e;

/// Whether a provider of `kind` serves `/v1/files`, `/v1/batches`, audio, images, moderations
/// and rerank as OpenAI does (same paths below its base URL, a Bearer key).
pub fn serves_surface(kind: ProviderKind) -> bool {
    matches!(kind, ProviderKind::OpenAi | ProviderKind::OpenAiCompatible)
}

/// The provider requests that name no model go to: `[routing] files_provider`, else the one
/// provider of an OpenAI-style kind (`None`: none, or several and no choice made).
pub fn files_provider(cfg: &Config) -> Option<&str> {
    if let Some(p) = &cfg.routing.files_provider {
        return Some(p.get_ref().as_str());
    }
    let mut it = cfg
        .providers
        .iter()
        .filter(|p| serves_surface(*p.kind.get_ref()));
    match (it.next(), it.next()) {
        (Some(p), None) => Some(p.name.get_ref().as_str()),
        _ => None,
    }
}

pub(super) fn validate(cfg: &Config, err: &mut Sink<'_>) {
    let Some(f) = &cfg.routing.files_provider else {
        return;
    };
    match cfg.providers.iter().find(|p| p.name.get_ref() == f.get_ref()) {
        None => err(
            f.span(),
            format!("[routing] files_provider {:?} is not a [[provider]]", f.get_ref()),
        ),
        Some(p) if !serves_surface(*p.kind.get_ref()) => err(
            f.span(),
            format!(
                "[routing] files_provider {:?} is of kind {:?}: files and batches go to an \"openai\" or \"openai-compatible\" provider",
                f.get_ref(),
                p.kind.get_ref().as_str()
            ),
        ),
        Some(_) => {}
    }
}

pub(super) fn warnings(cfg: &Config) -> Vec<String> {
    let several: Vec<&str> = cfg
        .providers
        .iter()
        .filter(|p| serves_surface(*p.kind.get_ref()))
        .map(|p| p.name.get_ref().as_str())
        .collect();
    if cfg.routing.files_provider.is_none() && several.len() > 1 {
        return vec![format!(
            "several OpenAI-style providers ({}) and no [routing] files_provider: /v1/files and /v1/batches requests get 400 until it names one",
            several.join(", ")
        )];
    }
    Vec::new()
}
