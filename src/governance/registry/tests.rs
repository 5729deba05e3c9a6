//! The registry's unit tests.

use super::*;

fn body(text: &str) -> Map<String, Value> {
    serde_json::from_str(text).unwrap()
}

#[test]
fn create_patch_revoke_publish_snapshots_with_stable_slots() {
    let hex = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"; // "test"
    let cfg = Config::parse(&format!(
        "[[key]]\nname = \"cfg\"\nkey_sha256 = \"{hex}\"\n"
    ))
    .unwrap();
    let (mut reg, _) = Registry::build(&cfg, &[], None).unwrap();
    let dir = reg.directory();
    assert!(reg.checked());
    let (v, secret) = reg.create(&body(r#"{"name":"a","rpm":5}"#), 100).unwrap();
    assert!(secret.starts_with("rg-") && secret.len() == 51, "{secret}");
    assert_eq!(v["source"], "api");
    assert!(!v.to_string().contains(&secret[3..]));
    let (_, ring) = dir.load();
    assert_eq!(ring.lookup(secret.as_bytes()), Some(1));
    assert_eq!(ring.lookup(b"test"), Some(0));
    // duplicates, unknowns, bad names, config keys
    let e = reg.create(&body(r#"{"name":"a"}"#), 101).unwrap_err();
    assert_eq!(e.status(), 409);
    assert_eq!(
        reg.create(&body(r#"{"name":"a b"}"#), 101)
            .unwrap_err()
            .status(),
        400
    );
    assert_eq!(
        reg.create(&body(r#"{"rpm":1}"#), 101).unwrap_err().status(),
        400
    );
    assert_eq!(reg.patch("nope", &body("{}"), 1).unwrap_err().status(), 404);
    assert_eq!(
        reg.patch("cfg", &body(r#"{"rpm":1}"#), 1)
            .unwrap_err()
            .status(),
        409
    );
    let v = reg
        .patch("a", &body(r#"{"rpm":7,"enabled":false}"#), 102)
        .unwrap();
    assert_eq!(
        (v["rpm"].as_u64(), v["enabled"].as_bool()),
        (Some(7), Some(false))
    );
    assert_eq!(dir.load().1.keys.get(1).unwrap().rpm, Some(7));
    // revoke: gone from lookups and listings, slot kept; the name can be made again
    reg.revoke("a", 103).unwrap();
    assert_eq!(dir.load().1.lookup(secret.as_bytes()), None);
    assert_eq!(reg.page(None, 100).unwrap().0.len(), 1);
    let (_, again) = reg.create(&body(r#"{"name":"a"}"#), 104).unwrap();
    let ring = dir.load().1;
    assert_eq!(
        (ring.keys.len(), ring.lookup(again.as_bytes())),
        (2, Some(1))
    );
    reg.revoke("cfg", 105).unwrap();
    assert_eq!(dir.load().1.lookup(b"test"), None);
    assert_eq!(reg.revoke("cfg", 106).unwrap_err().status(), 404);
}

#[test]
fn a_change_shares_every_other_key_with_the_last_snapshot() {
    let (mut reg, _) = Registry::build(&Config::parse("").unwrap(), &[], None).unwrap();
    let dir = reg.directory();
    for i in 0..2_000 {
        let b = body(&format!(r#"{{"name":"k{i}","rpm":{}}}"#, i + 1));
        reg.create(&b, 1).unwrap();
    }
    let (_, before) = dir.load();
    reg.create(&body(r#"{"name":"new"}"#), 2).unwrap();
    reg.patch("k7", &body(r#"{"rpm":99}"#), 3).unwrap();
    reg.revoke("k9", 4).unwrap();
    let (_, after) = dir.load();
    assert_eq!((before.keys.len(), after.keys.len()), (2_000, 2_001));
    // no key was copied or compiled again but the three that changed
    for i in 0..2_000 {
        let (a, b) = (before.keys.get(i).unwrap(), after.keys.get(i).unwrap());
        assert_eq!(std::ptr::eq(a, b), ![7, 9].contains(&i), "slot {i}");
    }
    assert_eq!(after.keys.get(7).unwrap().rpm, Some(99));
    assert_eq!(after.keys.get(2_000).unwrap().name.as_ref(), "new");
    assert_eq!(after.usable(), 2_000);
}

#[test]
fn pages_follow_slot_order_after_a_name() {
    let (mut reg, _) = Registry::build(&Config::parse("").unwrap(), &[], None).unwrap();
    for i in 0..2_000 {
        reg.create(&body(&format!(r#"{{"name":"k{i}"}}"#)), 1)
            .unwrap();
    }
    reg.create(&body(r#"{"name":"new"}"#), 2).unwrap();
    reg.revoke("k9", 4).unwrap();
    // after a name (a revoked one still marks its place); revoked keys are not listed
    let (page, more) = reg.page(Some("k8"), 3).unwrap();
    let names: Vec<&str> = page.iter().map(|k| k["name"].as_str().unwrap()).collect();
    assert_eq!((names, more), (vec!["k10", "k11", "k12"], true));
    let (page, more) = reg.page(Some("k9"), 1).unwrap();
    assert_eq!((page[0]["name"].as_str(), more), (Some("k10"), true));
    let (page, more) = reg.page(Some("k1999"), 1000).unwrap();
    assert_eq!(
        (page.len(), page[0]["name"].as_str(), more),
        (1, Some("new"), false)
    );
    assert_eq!(reg.page(Some("nobody"), 10).unwrap_err().status(), 400);
}

#[test]
fn auth_turns_on_with_the_first_key_and_none_refuses_keys() {
    let (mut reg, _) = Registry::build(&Config::parse("").unwrap(), &[], None).unwrap();
    assert!(!reg.checked() && !reg.directory().load().1.checked);
    reg.create(&body(r#"{"name":"first"}"#), 1).unwrap();
    assert!(reg.checked() && reg.directory().load().1.checked);
    reg.revoke("first", 2).unwrap();
    assert!(
        reg.directory().load().1.checked,
        "revoking the last key keeps keys on"
    );
    let none = Config::parse("[server]\nauth = \"none\"\n").unwrap();
    let (mut reg, _) = Registry::build(&none, &[], None).unwrap();
    assert_eq!(
        reg.create(&body(r#"{"name":"x"}"#), 1)
            .unwrap_err()
            .status(),
        409
    );
}
