//! Where a running config came from: the file it was read from and what the command line (or
//! the binary's defaults) laid over it. A reload reads the same file and lays the same things
//! over the new text, so an override is not mistaken for a change that needs a restart.
//!
//! Owns: `Origin`. Must not: read files (that is `Config::load`) or validate.

use std::path::PathBuf;

/// The file and the overrides of a config (`Config::origin`; not part of the file).
#[derive(Debug, Clone, Default)]
pub struct Origin {
    /// The file (`None`: the built-in config, or text given to `Config::parse`).
    pub path: Option<PathBuf>,
    /// The text read from it (what `hash` is of; a reload compares and shows it).
    pub text: Option<std::sync::Arc<str>>,
    /// `--listen`: wins over `server.listen`.
    pub listen: Option<String>,
    /// `--shards`: wins over `server.shards`.
    pub shards: Option<usize>,
    /// Used when the file sets no `server.state_dir` (the binary's default data dir).
    pub state_dir: Option<String>,
}

impl Origin {
    /// Lay the overrides over `cfg` (and remember them in it).
    pub fn apply(&self, cfg: &mut super::Config) {
        if let Some(l) = &self.listen {
            cfg.server.listen = toml::Spanned::new(0..0, l.clone());
        }
        if let Some(n) = self.shards {
            cfg.server.shards = Some(n);
        }
        if cfg.server.state_dir.is_none() {
            cfg.server.state_dir = self.state_dir.clone();
        }
        let text = cfg.origin.text.take();
        cfg.origin = Origin {
            text,
            ..self.clone()
        };
    }
}
