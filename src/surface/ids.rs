//! Which provider issued a file or batch id: a bounded map, process-wide, filled from the
//! answers that carry new ids (an upload, a batch create or retrieve: its `id`,
//! `output_file_id`, `error_file_id`).
//!
//! Why a map and not an id prefix the gateway adds: the ids stay the provider's own, so they
//! work wherever else they are used — a chat request's `file_id` input, a batch's
//! `input_file_id`, the provider's dashboard, another client talking to the provider directly
//! — and nothing in the answers is rewritten. An id the map does not know (evicted, issued
//! before a restart, seen by another appliance) goes to the files provider, which issued it in
//! the common case (uploads always go there).
//!
//! Bounds: [`CAPACITY`] ids, oldest forgotten first; one short mutex hold per id call (off the
//! chat path: only surface requests with an id or an id-carrying answer touch it).
//!
//! Owns: the map. Must not: route (the caller resolves the name in its route table) or parse
//! bodies beyond the id fields.

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, OnceLock};

/// Ids remembered at once.
pub const CAPACITY: usize = 65_536;

#[derive(Default)]
struct Map {
    by_id: HashMap<Box<str>, Box<str>>,
    order: VecDeque<Box<str>>,
}

fn map() -> &'static Mutex<Map> {
    static MAP: OnceLock<Mutex<Map>> = OnceLock::new();
    MAP.get_or_init(Mutex::default)
}

/// Remember that `provider` issued `id`.
pub fn learn(id: &str, provider: &str) {
    if super::check_id(id.as_bytes()).is_err() {
        return;
    }
    let Ok(mut m) = map().lock() else { return };
    let m = &mut *m;
    if let Some(p) = m.by_id.get_mut(id) {
        if &**p != provider {
            *p = provider.into();
        }
        return;
    }
    while m.order.len() >= CAPACITY {
        if let Some(old) = m.order.pop_front() {
            m.by_id.remove(&old);
        }
    }
    m.by_id.insert(id.into(), provider.into());
    m.order.push_back(id.into());
}

/// The provider that issued `id`, if it is remembered.
pub fn issuer(id: &str) -> Option<Box<str>> {
    map().lock().ok()?.by_id.get(id).cloned()
}

/// The id fields of an answer that issues or names ids.
#[derive(serde::Deserialize)]
struct Ids<'a> {
    #[serde(borrow, default)]
    id: Option<&'a str>,
    #[serde(borrow, default)]
    output_file_id: Option<&'a str>,
    #[serde(borrow, default)]
    error_file_id: Option<&'a str>,
    #[serde(borrow, default)]
    input_file_id: Option<&'a str>,
}

/// Remember every id a JSON answer from `provider` carries (a body that is not such an object
/// teaches nothing).
pub fn learn_from(answer: &[u8], provider: &str) {
    let Ok(ids) = serde_json::from_slice::<Ids<'_>>(answer) else {
        return;
    };
    for id in [
        ids.id,
        ids.output_file_id,
        ids.error_file_id,
        ids.input_file_id,
    ]
    .into_iter()
    .flatten()
    {
        learn(id, provider);
    }
}

/// The `input_file_id` of a batch create body, checked like a path id.
pub fn input_file_id(body: &[u8]) -> Option<String> {
    let ids = serde_json::from_slice::<Ids<'_>>(body).ok()?;
    let id = ids.input_file_id?;
    super::check_id(id.as_bytes()).ok().map(String::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn learns_and_forgets_the_oldest() {
        learn("file-ids-test-1", "a");
        assert_eq!(issuer("file-ids-test-1").as_deref(), Some("a"));
        learn("file-ids-test-1", "b");
        assert_eq!(issuer("file-ids-test-1").as_deref(), Some("b"));
        learn("bad id", "a");
        assert_eq!(issuer("bad id"), None);
        learn_from(
            br#"{"id":"batch_t2","output_file_id":"file-t2o","error_file_id":null,"x":[1]}"#,
            "c",
        );
        assert_eq!(issuer("batch_t2").as_deref(), Some("c"));
        assert_eq!(issuer("file-t2o").as_deref(), Some("c"));
        learn_from(b"[1,2]", "c");
        for i in 0..CAPACITY {
            learn(&format!("f{i}"), "z");
        }
        assert_eq!(issuer("batch_t2"), None);
        assert!(map().lock().unwrap().by_id.len() <= CAPACITY);
        assert_eq!(
            input_file_id(br#"{"input_file_id":"file-9","endpoint":"/v1/chat/completions"}"#)
                .as_deref(),
            Some("file-9")
        );
        assert_eq!(input_file_id(br#"{"input_file_id":"../x"}"#), None);
    }
}
