//! `ringgate doctor [--config FILE]`: one screen that says whether this box is ready to run the
//! gateway — kernel and io_uring, the driver each shard would get, limits, memory budget, CPUs,
//! sysctls against `tuning/`, the config, every provider (DNS, TCP, TLS, `GET /models`; the cloud kinds' credentials, `cloud`), and
//! every engine's load signal and served model names (`engine`).
//!
//! Owns: the report (findings by section, each an ok / warning / problem, problems and
//! warnings with the line that fixes them) and the exit rule: problems (things that stop the
//! gateway from starting or from reaching a provider) exit 1, warnings (a slower or less
//! robust box: epoll fallback, untuned sysctls, low limits) exit 0. Must not: change anything
//! on the box, or print a secret (provider keys are sent, never shown).

mod cloud;
mod engine;
mod provider;
mod setup;
mod sysctl;
mod system;

use std::fmt::Write;

/// How a finding counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Ok,
    Info,
    Warn,
    Problem,
}

struct Finding {
    level: Level,
    text: String,
    fix: Option<String>,
}

/// Findings by section, in order.
#[derive(Default)]
pub struct Report {
    sections: Vec<(String, Vec<Finding>)>,
}

impl Report {
    fn section(&mut self, title: impl Into<String>) {
        self.sections.push((title.into(), Vec::new()));
    }

    pub(super) fn add(&mut self, level: Level, text: impl Into<String>, fix: Option<String>) {
        if self.sections.is_empty() {
            self.section("");
        }
        if let Some((_, f)) = self.sections.last_mut() {
            f.push(Finding {
                level,
                text: text.into(),
                fix,
            });
        }
    }

    fn ok(&mut self, text: impl Into<String>) {
        self.add(Level::Ok, text, None);
    }

    fn info(&mut self, text: impl Into<String>) {
        self.add(Level::Info, text, None);
    }

    fn warn(&mut self, text: impl Into<String>, fix: impl Into<String>) {
        self.add(Level::Warn, text, Some(fix.into()));
    }

    fn problem(&mut self, text: impl Into<String>, fix: impl Into<String>) {
        self.add(Level::Problem, text, Some(fix.into()));
    }

    fn count(&self, level: Level) -> usize {
        self.sections
            .iter()
            .flat_map(|(_, f)| f)
            .filter(|f| f.level == level)
            .count()
    }

    pub fn problems(&self) -> usize {
        self.count(Level::Problem)
    }

    pub fn warnings(&self) -> usize {
        self.count(Level::Warn)
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        for (title, findings) in &self.sections {
            let _ = writeln!(out, "{title}");
            for f in findings {
                let tag = match f.level {
                    Level::Ok => "ok  ",
                    Level::Info => "    ",
                    Level::Warn => "WARN",
                    Level::Problem => "FAIL",
                };
                let _ = writeln!(out, "  {tag}  {}", f.text);
                if let Some(fix) = &f.fix {
                    let _ = writeln!(out, "        fix: {fix}");
                }
            }
        }
        let (p, w) = (self.problems(), self.warnings());
        let verdict = if p == 0 { "ready" } else { "NOT ready" };
        let _ = writeln!(out, "\n{verdict}: {p} problem(s), {w} warning(s)");
        out
    }
}

/// Run every check; `config` is the file `serve` would read (None: the built-in default).
pub fn run(config: Option<&str>) -> Report {
    let mut r = Report::default();
    let (title, loaded) = setup::load(config);
    let cfg = loaded.as_ref().ok();
    system::check(&mut r, cfg);
    sysctl::check(&mut r);
    r.section(title.clone());
    match &loaded {
        Ok(cfg) => {
            setup::check(&mut r, cfg);
            provider::check(&mut r, cfg);
            engine::check(&mut r, cfg);
        }
        Err(errs) => setup::report_errors(&mut r, &title, errs),
    }
    r
}

/// Bytes in a short human form (`1.5 GiB`).
fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn problems_decide_the_verdict_and_fixes_are_printed() {
        let mut r = Report::default();
        r.section("system");
        r.ok("kernel 6.1");
        r.warn("somaxconn 4096 < 8192", "sysctl -w net.core.somaxconn=8192");
        assert_eq!((r.problems(), r.warnings()), (0, 1));
        assert!(r.render().contains("ready: 0 problem(s), 1 warning(s)"));
        r.problem("provider a: DNS failed", "check base_url");
        let text = r.render();
        assert!(text.contains("FAIL  provider a: DNS failed\n        fix: check base_url"));
        assert!(text.contains("NOT ready: 1 problem(s)"));
        assert_eq!(human(3 << 29), "1.5 GiB");
    }
}
