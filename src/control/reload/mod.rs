//! Config hot reload (`SIGHUP`, `POST /admin/reload`): read the file the process started from,
//! validate it, and either keep the running config (every problem logged with its line, a
//! failed reload counted, the report says why) or publish the new one to every shard.
//!
//! - **Validate once, here**: the file parses and validates (`Config::parse`: every problem,
//!   with its line), it does not look emptied or cut short (`guard`: empty, no model or no key
//!   left without `[reload] allow_empty = true`, a lost final newline), the command line's
//!   overrides are laid over it again (`config::origin`),
//!   the TLS certificate and key load, config keys fit with the runtime ones. Nothing is
//!   published unless all of it passed.
//! - **Publish**: a changed `[telemetry]` starts its new trace export (`telemetry::switch`),
//!   the certificate replaces the TLS listener's (new connections), config keys
//!   are replaced in the key registry (runtime keys made through the admin API are kept) and
//!   the config goes into the process-wide `Versioned` every shard follows
//!   (`shard::routing`): each shard builds its route table from it on its next request, and
//!   requests already running finish on the table they started with. Upstream pools belong to
//!   the shard, keyed by host: pools of unchanged upstreams stay, and an upstream no route
//!   uses any more just stops being picked (its idle connections age out).
//! - **Report**: what changed (`diff::changes`), what needs a restart (`diff::restart_needed`,
//!   never silently ignored), the problems; `ringgate_config_reloads_total{result}` and
//!   `ringgate_config_info{hash}` follow. `GET /admin/config` shows the running file with its
//!   secrets masked (`redact`) and its hash.
//!
//! Owns: `Reloader`, `Report`. Must not: run on a shard (it reads a file; the admin thread or
//! the signal thread calls it) or change anything before the new config is known to be valid.

pub mod diff;
pub mod guard;

use std::sync::{Arc, Mutex};

use serde_json::{json, Value};

use crate::config::{Config, ConfigError};
use crate::forward::live::{Published, Setup};
use crate::governance::registry::Registry;
use crate::http::certs::TlsCerts;
use crate::observe::metrics::ProcessMetrics;

/// The outcome of one reload.
#[derive(Debug, Clone)]
pub struct Report {
    /// The new config runs.
    pub ok: bool,
    /// What asked for it (`SIGHUP`, `admin`).
    pub trigger: &'static str,
    /// The hash of the config running after it (the old one when it failed).
    pub hash: String,
    pub previous_hash: String,
    /// The published generation running after it.
    pub generation: u64,
    /// Why the file was refused (empty when `ok`).
    pub problems: Vec<ConfigError>,
    /// Settings the file changes that only a restart applies (they keep their old values).
    pub restart_needed: Vec<String>,
    /// What the reload applied.
    pub changes: Vec<String>,
    /// The applied file's start-up warnings (`Config::start_warnings`: no models, unset API-key
    /// env vars, …), also logged.
    pub warnings: Vec<String>,
}

impl Report {
    pub fn to_json(&self) -> Value {
        json!({
            "status": if self.ok { "reloaded" } else { "failed" },
            "trigger": self.trigger,
            "hash": self.hash,
            "previous_hash": self.previous_hash,
            "generation": self.generation,
            "problems": self.problems.iter().map(|p| json!({"line": p.line, "message": p.message})).collect::<Vec<_>>(),
            "restart_needed": self.restart_needed,
            "changes": self.changes,
            "warnings": self.warnings,
        })
    }
}

/// The running file: what the process started with (restart-needed settings are compared to
/// it) and what runs now.
struct Files {
    started: toml::Value,
    current: toml::Value,
    hash: String,
    restart_needed: Vec<String>,
    reloads: u64,
    /// The running file ended with a newline (`guard`: a new one that does not may be cut).
    ends_nl: bool,
    /// The upstream TLS client set up at start: (any `https://` upstream, the `ca_file`s).
    tls_client: (bool, Vec<String>),
}

/// What the upstream TLS client of `cfg` is built from (see `gateway::start`).
fn tls_client(cfg: &Config) -> (bool, Vec<String>) {
    let https = cfg.providers.iter().any(|p| {
        p.base_url
            .as_ref()
            .is_some_and(|u| u.get_ref().starts_with("https://"))
    });
    let mut ca: Vec<String> = cfg
        .providers
        .iter()
        .filter_map(|p| p.ca_file.clone())
        .collect();
    ca.sort();
    ca.dedup();
    (https, ca)
}

/// Reloads the config file into a running process (one per process; cheap to share).
pub struct Reloader {
    /// Every shard's source of routing (see `shard::routing`).
    published: Arc<Published>,
    process: Arc<ProcessMetrics>,
    registry: Option<Arc<Mutex<Registry>>>,
    tls: Option<Arc<TlsCerts>>,
    /// Serialises reloads; holds the running file.
    files: Mutex<Files>,
    /// The response cache, whose per-model policies follow `[[model]]` (`[cache]` itself
    /// needs a restart).
    cache: Option<Arc<crate::cache::Cache>>,
    /// The trace export a reload reconfigures (`[telemetry]`).
    telemetry: Option<Arc<crate::telemetry::switch::Switch>>,
}

impl Reloader {
    /// For a process that started with `cfg` (its file's text `text`, when it has one).
    pub fn new(
        cfg: &Config,
        text: Option<&str>,
        published: Arc<Published>,
        process: Arc<ProcessMetrics>,
        registry: Option<Arc<Mutex<Registry>>>,
        tls: Option<Arc<TlsCerts>>,
    ) -> Reloader {
        let tree = text
            .and_then(|t| t.parse::<toml::Value>().ok())
            .unwrap_or(toml::Value::Table(Default::default()));
        Reloader {
            published,
            process,
            registry,
            tls,
            files: Mutex::new(Files {
                started: tree.clone(),
                current: tree,
                hash: cfg.hash.clone(),
                restart_needed: Vec::new(),
                reloads: 0,
                ends_nl: text.is_some_and(|t| t.ends_with('\n')),
                tls_client: tls_client(cfg),
            }),
            cache: None,
            telemetry: None,
        }
    }

    /// Reloads also rebuild `cache`'s per-model policies.
    pub fn with_cache(mut self, cache: Option<Arc<crate::cache::Cache>>) -> Reloader {
        self.cache = cache;
        self
    }

    /// A reload applies `[telemetry]` to this export.
    pub fn with_telemetry(mut self, t: Arc<crate::telemetry::switch::Switch>) -> Reloader {
        self.telemetry = Some(t);
        self
    }

    /// The config every shard follows.
    pub fn published(&self) -> Arc<Published> {
        self.published.clone()
    }

    /// A reload stopped by `problems` (of the file `shown`): each logged, the reload counted
    /// as failed, the running config (`report.hash`) kept.
    fn refused(&self, shown: &str, mut report: Report, problems: Vec<ConfigError>) -> Report {
        for p in &problems {
            crate::observe::log::info(format_args!(
                "reload ({}): {shown}: {p}; keeping the running config {}",
                report.trigger, report.hash
            ));
        }
        self.process.reloaded(None);
        report.problems = problems;
        report
    }

    /// Read, validate and (when valid) apply the config file. Logs the outcome and counts it.
    pub fn reload(&self, trigger: &'static str) -> Report {
        let mut files = match self.files.lock() {
            Ok(f) => f,
            Err(p) => p.into_inner(),
        };
        let (generation, running) = self.published.load();
        let mut report = Report {
            ok: false,
            trigger,
            hash: files.hash.clone(),
            previous_hash: files.hash.clone(),
            generation,
            problems: Vec::new(),
            restart_needed: files.restart_needed.clone(),
            changes: Vec::new(),
            warnings: Vec::new(),
        };
        let path = running.config.origin.path.clone();
        let loaded = match &path {
            Some(p) => Config::load_text(&p.to_string_lossy()),
            None => Err(vec![ConfigError {
                line: None,
                message: "no config file to reload: the process runs the built-in config (start it with --config FILE)".into(),
            }]),
        };
        let shown = path
            .as_ref()
            .map_or_else(|| "(built-in)".into(), |p| p.display().to_string());
        let ends_nl = files.ends_nl;
        let staged = loaded.and_then(|(mut cfg, text)| {
            let refused = guard::check(&running.config, ends_nl, &text, &cfg);
            if !refused.is_empty() {
                return Err(refused);
            }
            running.config.origin.apply(&mut cfg);
            let tree = text.parse::<toml::Value>().map_err(|e| {
                vec![ConfigError {
                    line: None,
                    message: e.message().to_string(),
                }]
            })?;
            let certs = self.stage_tls(&cfg)?;
            Ok((cfg, tree, certs, text.ends_with('\n')))
        });
        let (cfg, tree, certs, ends_with_nl) = match staged {
            Ok(s) => s,
            Err(problems) => return self.refused(&shown, report, problems),
        };
        // keys last among the checks: replacing them is also what applies them
        if let Some(reg) = &self.registry {
            let mut reg = match reg.lock() {
                Ok(r) => r,
                Err(p) => p.into_inner(),
            };
            if let Err(problems) = reg.reload_config_keys(&cfg) {
                return self.refused(&shown, report, problems);
            }
        }
        if let (Some(tls), Some(server)) = (&self.tls, certs) {
            tls.replace(server);
        }
        report.changes = diff::changes(&files.current, &tree);
        report.restart_needed = diff::restart_needed(&files.started, &tree, &cfg.origin);
        // the upstream TLS client is built at start: a first https:// upstream or other CAs
        let (https, ca) = tls_client(&cfg);
        if https && !files.tls_client.0 {
            report
                .restart_needed
                .push("provider.base_url (the first https:// upstream)".into());
        }
        if https && ca != files.tls_client.1 {
            report.restart_needed.push("provider.ca_file".into());
        }
        // engine load signals: unchanged engines keep their cell and poller (`engine`)
        let engines = crate::engine::Engines::start(&cfg, Some(&running.engines));
        // routing knowledge: the new tables find the cells of what they keep (`forward::shared`)
        let routing_cells = running.routing_cells.clone();
        report.hash = cfg.hash.clone();
        report.ok = true;
        report.warnings = cfg.start_warnings();
        let hash = cfg.hash.clone();
        if let Some(c) = &self.cache {
            c.reconfigure(&cfg);
        }
        // [telemetry]: a changed block starts its new export (shards follow on their next
        // request); one that cannot start leaves the running export
        if let Some(t) = &self.telemetry {
            if let Err(why) = t.apply(&cfg.telemetry) {
                report
                    .restart_needed
                    .push(format!("telemetry (the export did not start: {why})"));
            }
        }
        report.generation = self.published.publish(Setup {
            config: cfg,
            engines,
            routing_cells,
        });
        self.process.reloaded(Some(&hash));
        files.current = tree;
        files.hash = hash;
        files.restart_needed = report.restart_needed.clone();
        files.reloads += 1;
        files.ends_nl = ends_with_nl;
        let none = || "nothing".to_string();
        crate::observe::log::info(format_args!(
            "reload ({trigger}): {shown}: config {} -> {} (generation {}): applied {}{}",
            report.previous_hash,
            report.hash,
            report.generation,
            if report.changes.is_empty() {
                none()
            } else {
                report.changes.join(", ")
            },
            if report.restart_needed.is_empty() {
                String::new()
            } else {
                format!(
                    "; restart needed for {} (they keep their running values)",
                    report.restart_needed.join(", ")
                )
            }
        ));
        for w in &report.warnings {
            crate::observe::log::info(format_args!("reload ({trigger}): warning: {w}"));
        }
        report
    }

    /// The new certificate, loaded (not yet served), when the TLS listener runs.
    fn stage_tls(
        &self,
        cfg: &Config,
    ) -> Result<Option<Arc<rustls::ServerConfig>>, Vec<ConfigError>> {
        if self.tls.is_none() {
            return Ok(None);
        }
        let (Some(cert), Some(key)) = (&cfg.server.tls_cert, &cfg.server.tls_key) else {
            // the listener stays (a restart-needed change); so does its certificate
            return Ok(None);
        };
        crate::http::certs::server_config(
            std::path::Path::new(cert.get_ref()),
            std::path::Path::new(key.get_ref()),
        )
        .map(Some)
        .map_err(|e| {
            vec![ConfigError {
                line: None,
                message: format!("TLS certificate: {e}"),
            }]
        })
    }

    /// `GET /admin/config`: the running file with its secrets masked, its hash, the published
    /// generation and what still needs a restart.
    pub fn running(&self) -> Value {
        let files = match self.files.lock() {
            Ok(f) => f,
            Err(p) => p.into_inner(),
        };
        let (generation, setup) = self.published.load();
        let cfg = &setup.config;
        let shown = crate::config::redact::redact(&files.current);
        json!({
            "hash": files.hash,
            "generation": generation,
            "path": cfg.origin.path.as_ref().map(|p| p.display().to_string()),
            "reloads": files.reloads,
            "restart_needed": files.restart_needed,
            "config": serde_json::to_value(&shown).unwrap_or(Value::Null),
            "toml": toml::to_string(&shown).unwrap_or_default(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "[server]\nlisten = \"127.0.0.1:0\"\n\n[[provider]]\nname = \"up\"\nkind = \"openai\"\nbase_url = \"http://127.0.0.1:9/v1\"\n\n[[model]]\nname = \"a\"\nprovider = \"up\"\n";

    #[test]
    fn invalid_keeps_the_config_valid_publishes_and_reports_restart_needed() {
        let dir = std::env::temp_dir().join(format!("rg-reload-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("c.toml");
        std::fs::write(&path, A).unwrap();
        let (cfg, text) = Config::load_text(&path.to_string_lossy()).unwrap();
        let published = Arc::new(Published::new(Setup::plain(cfg.clone())));
        let process = Arc::new(ProcessMetrics::new(&cfg.hash));
        let r = Reloader::new(&cfg, Some(&text), published.clone(), process, None, None);

        // a model on an unknown provider, on line 11: refused, nothing published
        std::fs::write(
            &path,
            A.replace("provider = \"up\"\n", "provider = \"nope\"\n"),
        )
        .unwrap();
        let bad = r.reload("test");
        assert!(!bad.ok);
        assert_eq!(bad.hash, cfg.hash);
        assert!(bad.problems.iter().any(|p| p.line == Some(11)), "{bad:?}");
        assert_eq!(published.generation(), 0);

        // valid: a new model, an https upstream and another listen address
        let b = A
            .replace("127.0.0.1:0", "127.0.0.1:1")
            .replace("http://127.0.0.1:9", "https://127.0.0.1:9")
            + "\n[[model]]\nname = \"b\"\nprovider = \"up\"\n";
        std::fs::write(&path, &b).unwrap();
        let ok = r.reload("test");
        assert!(ok.ok, "{ok:?}");
        assert_eq!(ok.generation, 1);
        assert_eq!(ok.hash, crate::config::text_hash(&b));
        assert_eq!(
            ok.restart_needed,
            [
                "server.listen",
                "provider.base_url (the first https:// upstream)"
            ]
        );
        assert!(ok.changes.contains(&"model b added".to_string()), "{ok:?}");
        let (_, now) = published.load();
        assert_eq!(now.config.models.len(), 2);
        let shown = r.running();
        assert_eq!(shown["hash"], ok.hash.as_str());
        assert_eq!(shown["restart_needed"][0], "server.listen");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
