//! Cloud credentials shared by every shard: one refreshing cell per distinct provider
//! credential setup per process (AWS credentials for `kind = "bedrock"`, an OAuth access token
//! for `kind = "vertex"`), filled and refreshed by its own helper thread, read by the shards.
//!
//! The thread resolves at once, then again before the value expires: at `expires - margin`,
//! the margin 5 minutes or half the remaining lifetime when that is shorter (so a 15-minute
//! STS session is renewed after 10, a short-lived test token halfway). A failed resolution is
//! retried after 1, 2, 4 … 30 s, while the old value keeps serving until it expires. Values
//! without an expiry are resolved again hourly. The thread ends when no routing table holds
//! its cell any more (a reload that changed the setup).
//!
//! A shard reads the value with one mutex lock and an `Arc` clone per request; a request that
//! arrives before the first resolution waits for it (polling, at most [`FIRST_WAIT`]) on its
//! own task — the shard keeps serving.
//!
//! Owns: `Cell`, the registry, the refresh schedule. Must not: log or return a secret (errors
//! say what failed, never a key or token).

use std::any::Any;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use crate::error::{Error, Kind};

/// Longest wait of a request for a cell's first value.
pub const FIRST_WAIT: Duration = Duration::from_secs(15);
/// Most a value is renewed ahead of its expiry.
const MAX_MARGIN: u64 = 300;
const NO_EXPIRY_REFRESH: u64 = 3600;

/// Unix seconds now.
pub fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

struct State<T> {
    value: Option<Arc<T>>,
    expires: Option<u64>,
    error: Option<String>,
    resolved: u64,
}

/// One refreshing value.
pub struct Cell<T> {
    what: String,
    state: Mutex<State<T>>,
}

impl<T> std::fmt::Debug for Cell<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cell")
            .field("what", &self.what)
            .finish_non_exhaustive()
    }
}

impl<T: Send + Sync + 'static> Cell<T> {
    /// The current value, when there is one (an expired one too: the thread is renewing it).
    pub fn peek(&self) -> Result<Option<Arc<T>>, String> {
        let s = self.state.lock().map_err(|_| "poisoned".to_string())?;
        match (&s.value, &s.error) {
            (Some(v), _) => Ok(Some(v.clone())),
            (None, Some(e)) => Err(e.clone()),
            (None, None) => Ok(None),
        }
    }

    /// How many times the value was resolved (for tests and `doctor`).
    pub fn resolved(&self) -> u64 {
        self.state.lock().map_or(0, |s| s.resolved)
    }

    /// The value for a request, waiting (on this task) for the first one.
    pub async fn get(&self) -> Result<Arc<T>, Error> {
        let unavailable = |why: &str| {
            Error::new(
                Kind::Internal,
                format!("{} are not available: {why}", self.what),
            )
        };
        let start = std::time::Instant::now();
        loop {
            match self.peek() {
                Ok(Some(v)) => return Ok(v),
                Err(e) => return Err(unavailable(&e)),
                Ok(None) if start.elapsed() >= FIRST_WAIT => {
                    return Err(unavailable("the first resolution is still running"))
                }
                Ok(None) => monoio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    }

    fn set(&self, r: Result<(T, Option<u64>), String>) -> Option<u64> {
        let Ok(mut s) = self.state.lock() else {
            return None;
        };
        match r {
            Ok((v, exp)) => {
                s.value = Some(Arc::new(v));
                s.expires = exp;
                s.error = None;
                s.resolved = s.resolved.saturating_add(1);
                Some(exp.map_or(NO_EXPIRY_REFRESH, refresh_in))
            }
            Err(e) => {
                // an expired value is dropped once renewing it failed: requests get the error
                if s.expires.is_some_and(|x| x <= now()) {
                    s.value = None;
                }
                s.error = Some(e);
                None
            }
        }
    }
}

/// Seconds until a value expiring at `expires` is renewed.
fn refresh_in(expires: u64) -> u64 {
    let left = expires.saturating_sub(now());
    let margin = MAX_MARGIN.min(left / 2);
    (left - margin).max(1)
}

type Entry = (String, Weak<dyn Any + Send + Sync>);

fn registry() -> &'static Mutex<Vec<Entry>> {
    static REG: Mutex<Vec<Entry>> = Mutex::new(Vec::new());
    &REG
}

/// The process's cell for `key` (a setup's fingerprint), started when no live one exists:
/// its thread resolves with `resolve`, which returns the value and its expiry (Unix seconds).
pub fn cell<T, F>(key: String, what: String, resolve: F) -> Arc<Cell<T>>
where
    T: Send + Sync + 'static,
    F: Fn() -> Result<(T, Option<u64>), String> + Send + 'static,
{
    let Ok(mut reg) = registry().lock() else {
        return Arc::new(Cell {
            what,
            state: Mutex::new(State {
                value: None,
                expires: None,
                error: Some("the credential registry is poisoned".into()),
                resolved: 0,
            }),
        });
    };
    reg.retain(|(_, w)| w.strong_count() > 0);
    if let Some(c) = reg
        .iter()
        .filter(|(k, _)| *k == key)
        .find_map(|(_, w)| w.upgrade()?.downcast::<Cell<T>>().ok())
    {
        return c;
    }
    let c = Arc::new(Cell {
        what: what.clone(),
        state: Mutex::new(State {
            value: None,
            expires: None,
            error: None,
            resolved: 0,
        }),
    });
    let any: Arc<dyn Any + Send + Sync> = c.clone();
    reg.push((key, Arc::downgrade(&any)));
    let weak = Arc::downgrade(&c);
    let spawned = std::thread::Builder::new()
        .name("rg-cloud-auth".into())
        .spawn(move || run(weak, what, resolve));
    if let Err(e) = spawned {
        c.set(Err(format!("could not start the credential thread: {e}")));
    }
    c
}

fn run<T, F>(weak: Weak<Cell<T>>, what: String, resolve: F)
where
    T: Send + Sync + 'static,
    F: Fn() -> Result<(T, Option<u64>), String>,
{
    let mut failures = 0u32;
    let mut last_error: Option<String> = None;
    loop {
        if weak.strong_count() == 0 {
            return;
        }
        let r = resolve();
        let Some(c) = weak.upgrade() else { return };
        let wait = match &r {
            Ok(_) => {
                if last_error.take().is_some() {
                    crate::observe::log::info(format_args!("{what}: resolved again"));
                }
                failures = 0;
                c.set(r).unwrap_or(1)
            }
            Err(e) => {
                if last_error.as_deref() != Some(e) {
                    crate::observe::log::info(format_args!("{what}: {e}"));
                    last_error = Some(e.clone());
                }
                c.set(r);
                failures = failures.saturating_add(1);
                (1u64 << (failures - 1).min(5)).min(30)
            }
        };
        drop(c);
        // sleep in slices so a dropped cell ends the thread soon
        let until = std::time::Instant::now() + Duration::from_secs(wait);
        while std::time::Instant::now() < until {
            if weak.strong_count() == 0 {
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refresh_margin() {
        let t = now();
        assert_eq!(refresh_in(t + 3600), 3300);
        assert_eq!(refresh_in(t + 20), 10);
        assert_eq!(refresh_in(t), 1);
    }

    #[test]
    fn one_cell_per_key() {
        let a = cell("k-test".into(), "x".into(), || Ok((1u32, None)));
        let b = cell("k-test".into(), "x".into(), || Ok((2u32, None)));
        assert!(Arc::ptr_eq(&a, &b));
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while a.peek().unwrap().is_none() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(*a.peek().unwrap().unwrap(), 1);
    }
}
