//! The key admin API's lifecycle: keys made at runtime, patched limits, revocation seen on every
//! shard, keys kept across a restart, config keys listed and revocable (part of the `admin` test
//! binary; the fixtures live in its root).

use super::*;

#[test]
fn a_key_made_at_runtime_works_at_once_and_is_listed_without_its_secret() {
    let dir = Dir::new("create");
    let gw = Gw::start(&dir, &config(&dir.0, 4, "", ADMIN, "instant"), Some(TOKEN));
    // no key yet: the gateway is open (loopback, nothing configured)
    assert_eq!(
        request(gw.main, &post("/v1/chat/completions", CHAT)).status,
        200
    );
    let (v, secret) = create(
        &gw,
        r#"{"name":"team-a","models":["gpt-4o-mini"],"rpm":1000}"#,
    );
    assert!(
        secret.starts_with("rg-") && secret.len() >= 3 + 32,
        "{secret}"
    );
    assert_eq!(
        (v["name"].as_str(), v["source"].as_str()),
        (Some("team-a"), Some("api"))
    );
    // at once, on fresh connections (spread over the 4 shards)
    for i in 0..16 {
        assert_eq!(chat(gw.main, &secret), 200, "request {i}");
    }
    // the first key turned keys on
    assert_eq!(
        request(gw.main, &post("/v1/chat/completions", CHAT)).status,
        401
    );
    assert_eq!(chat(gw.main, "rg-not-a-key"), 401);
    // listed, with its settings, never its secret or digest
    let r = admin_req(gw.admin(), "GET", "/admin/keys", Some(TOKEN), "");
    let text = r.text();
    assert!(
        !text.contains(&secret[3..]) && !text.contains("\"key\""),
        "{text}"
    );
    let keys = r.json()["keys"].as_array().unwrap().clone();
    assert_eq!(keys.len(), 1);
    assert_eq!(keys[0]["rpm"], 1000);
    let r = admin_req(gw.admin(), "GET", "/admin/keys/team-a", Some(TOKEN), "");
    assert_eq!(
        (r.status, r.json()["models"][0].as_str()),
        (200, Some("gpt-4o-mini"))
    );
    assert_eq!(
        admin_req(gw.admin(), "GET", "/admin/keys/nobody", Some(TOKEN), "").status,
        404
    );
    let r = admin_req(
        gw.admin(),
        "POST",
        "/admin/keys",
        Some(TOKEN),
        r#"{"name":"team-a"}"#,
    );
    assert_eq!(
        (r.status, r.json()["error"]["code"].as_str()),
        (409, Some("conflict"))
    );
    // the log names keys, never secrets
    let log: Vec<String> = gw.log.try_iter().collect();
    assert!(
        log.iter().any(|l| l.contains("key \"team-a\" created")),
        "{log:?}"
    );
    assert!(!log.iter().any(|l| l.contains(&secret[3..])));
}

#[test]
fn patched_limits_take_effect_on_the_next_request() {
    common::shard_counts().for_each(patched_limits_take_effect_on_the_next_request_at);
}

fn patched_limits_take_effect_on_the_next_request_at(shards: usize) {
    let dir = Dir::new("patch");
    let gw = Gw::start(
        &dir,
        &config(&dir.0, shards, "", ADMIN, "instant"),
        Some(TOKEN),
    );
    let (_, secret) = create(&gw, r#"{"name":"team-b"}"#);
    let patch = |body: &str| {
        let r = admin_req(gw.admin(), "PATCH", "/admin/keys/team-b", Some(TOKEN), body);
        assert_eq!(r.status, 200, "{body}: {}", r.text());
        r.json()
    };
    assert_eq!(chat(gw.main, &secret), 200);
    let v = patch(r#"{"models":["other-model"]}"#);
    assert_eq!(v["models"][0], "other-model");
    assert_eq!(chat(gw.main, &secret), 403);
    patch(r#"{"models":null,"rpm":2}"#);
    let statuses: Vec<u16> = (0..3).map(|_| chat(gw.main, &secret)).collect();
    assert_eq!(
        statuses,
        [200, 200, 429],
        "rpm = 2 counts from the patch on"
    );
    patch(r#"{"rpm":null,"enabled":false}"#);
    assert_eq!(chat(gw.main, &secret), 401);
    patch(r#"{"enabled":true,"expires":"2001-01-01T00:00:00Z"}"#);
    assert_eq!(chat(gw.main, &secret), 401, "expired");
    patch(r#"{"expires":null}"#);
    assert_eq!(chat(gw.main, &secret), 200);
    let r = admin_req(
        gw.admin(),
        "PATCH",
        "/admin/keys/team-b",
        Some(TOKEN),
        r#"{"rpm":-3}"#,
    );
    assert_eq!(r.status, 400);
    // a budget set at runtime is enforced against what the key already spent; without
    // max_in_flight the answer warns (uncapped requests at once can spend past it)
    let v = patch(r#"{"budget_usd":0.000001}"#);
    let w = v["warnings"][0].as_str().unwrap_or_default();
    assert!(w.contains("max_in_flight"), "{v}");
    let r = request(gw.main, &chat_raw(&secret, CHAT));
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "insufficient_quota");
    let v = patch(r#"{"max_in_flight":5}"#);
    assert!(v.get("warnings").is_none(), "{v}");
    let v = patch(r#"{"budget_usd":null,"max_in_flight":null}"#);
    assert!(v.get("warnings").is_none(), "{v}");
    assert_eq!(chat(gw.main, &secret), 200);
}

/// Open keep-alive connections until the keyed requests on them have been served by every
/// shard (per-shard metrics on the loopback main listener say which).
fn connections_on_every_shard(gw: &Gw, secret: &str, shards: usize) -> Vec<TcpStream> {
    let mut conns = Vec::new();
    for _ in 0..64 {
        let mut s = connect(gw.main);
        s.write_all(&chat_raw(secret, CHAT)).unwrap();
        let mut buf = Vec::new();
        assert_eq!(read_response(&mut s, &mut buf).unwrap().status, 200);
        conns.push(s);
    }
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        let m = request(gw.main, &get("/metrics")).text();
        let covered = (0..shards)
            .filter(|i| {
                m.contains(&format!(
                    "ringgate_key_requests_total{{shard=\"{i}\",key=\"team-r\""
                ))
            })
            .count();
        if covered == shards {
            return conns;
        }
        assert!(
            Instant::now() < until,
            "64 connections did not reach all {shards} shards:\n{m}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_revoked_key_stops_on_every_shard_within_a_second() {
    let dir = Dir::new("revoke");
    let shards = 4;
    let gw = Gw::start(
        &dir,
        &config(&dir.0, shards, "", ADMIN, "instant"),
        Some(TOKEN),
    );
    let (_, secret) = create(&gw, r#"{"name":"team-r"}"#);
    let mut conns = connections_on_every_shard(&gw, &secret, shards);
    let r = admin_req(gw.admin(), "DELETE", "/admin/keys/team-r", Some(TOKEN), "");
    assert_eq!(r.status, 200, "{}", r.text());
    let revoked = Instant::now();
    // every open connection (all shards) and new ones: 401 from the next request on
    for s in conns.iter_mut() {
        s.write_all(&chat_raw(&secret, CHAT)).unwrap();
        let mut buf = Vec::new();
        assert_eq!(read_response(s, &mut buf).unwrap().status, 401);
    }
    for _ in 0..8 {
        assert_eq!(chat(gw.main, &secret), 401);
    }
    // every request right after the DELETE got its 401 (the asserts above): revocation does
    // not wait for a periodic sync; the bound only catches a request stuck for long
    let took = revoked.elapsed();
    assert!(took < Duration::from_secs(10), "{took:?}");
    assert_eq!(
        admin_req(gw.admin(), "GET", "/admin/keys/team-r", Some(TOKEN), "").status,
        404
    );
    assert_eq!(
        admin_req(gw.admin(), "DELETE", "/admin/keys/team-r", Some(TOKEN), "").status,
        404
    );
    // the name can be made again, with a new secret; the old one stays dead
    let (_, again) = create(&gw, r#"{"name":"team-r"}"#);
    assert_eq!(chat(gw.main, &again), 200);
    assert_eq!(chat(gw.main, &secret), 401);
}

#[test]
fn a_restart_with_the_same_state_dir_keeps_runtime_keys() {
    let dir = Dir::new("restart");
    let cfg = config(&dir.0, 2, "", ADMIN, "instant");
    let gw = Gw::start(&dir, &cfg, Some(TOKEN));
    let (_, kept) = create(&gw, r#"{"name":"kept","rpm":500}"#);
    let (_, gone) = create(&gw, r#"{"name":"gone"}"#);
    admin_req(
        gw.admin(),
        "PATCH",
        "/admin/keys/kept",
        Some(TOKEN),
        r#"{"models":["gpt-4o-mini"]}"#,
    );
    admin_req(gw.admin(), "DELETE", "/admin/keys/gone", Some(TOKEN), "");
    assert_eq!(chat(gw.main, &kept), 200);
    assert_eq!(gw.terminate(), Some(0));
    assert!(dir.0.join("state/state.db").exists());

    let gw = Gw::start(&dir, &cfg, Some(TOKEN));
    assert_eq!(
        chat(gw.main, &kept),
        200,
        "the runtime key works after the restart"
    );
    assert_eq!(chat(gw.main, &gone), 401, "a revoked key stays revoked");
    let r = admin_req(gw.admin(), "GET", "/admin/keys", Some(TOKEN), "");
    let keys = r.json()["keys"].as_array().unwrap().clone();
    assert_eq!(keys.len(), 1, "{}", r.text());
    assert_eq!(
        (keys[0]["name"].as_str(), keys[0]["rpm"].as_u64()),
        (Some("kept"), Some(500))
    );
    assert_eq!(keys[0]["models"][0], "gpt-4o-mini");
    // keys stay on after a restart even with no key in the config
    assert_eq!(
        request(gw.main, &post("/v1/chat/completions", CHAT)).status,
        401
    );
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.0.join("state"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "the state dir is private: {mode:o}");
    }
}

#[test]
fn config_keys_are_listed_revocable_and_not_patchable() {
    common::shard_counts().for_each(config_keys_are_listed_revocable_and_not_patchable_at);
}

fn config_keys_are_listed_revocable_and_not_patchable_at(shards: usize) {
    let dir = Dir::new("cfgkeys");
    let secret = "rg-config-key-secret-0123456789abcdef";
    let hex: String = ringgate::governance::keyring::Digest::of(secret.as_bytes())
        .0
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let keys = format!("\n[[key]]\nname = \"from-file\"\nkey_sha256 = \"{hex}\"\nrpm = 50\n");
    let cfg = config(&dir.0, shards, "", ADMIN, "instant") + &keys;
    let gw = Gw::start(&dir, &cfg, Some(TOKEN));
    let r = admin_req(gw.admin(), "GET", "/admin/keys/from-file", Some(TOKEN), "");
    assert_eq!(
        (r.json()["source"].as_str(), r.json()["rpm"].as_u64()),
        (Some("config"), Some(50))
    );
    let r = admin_req(
        gw.admin(),
        "PATCH",
        "/admin/keys/from-file",
        Some(TOKEN),
        r#"{"rpm":1}"#,
    );
    assert_eq!(r.status, 409);
    assert_eq!(chat(gw.main, secret), 200);
    assert_eq!(
        admin_req(
            gw.admin(),
            "DELETE",
            "/admin/keys/from-file",
            Some(TOKEN),
            ""
        )
        .status,
        200
    );
    assert_eq!(chat(gw.main, secret), 401);
    assert_eq!(gw.terminate(), Some(0));
    // revoked by name and digest: still revoked after a restart with the same file
    let gw = Gw::start(&dir, &cfg, Some(TOKEN));
    assert_eq!(chat(gw.main, secret), 401);
}
