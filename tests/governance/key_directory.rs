//! The key directory at scale through the admin API (issue 20, item 9), in process, at 1 and 2
//! shards on each driver: `GET /admin/keys` pages walk 2,500 keys exactly once in creation
//! order, `limit` and `after` are checked (400), and keys made, changed and revoked among
//! thousands work at once on every shard (fresh connections land on either shard).

#[path = "../common/mod.rs"]
mod common;

use std::io::Write;
use std::net::{SocketAddr, TcpStream};

use common::*;
use ringgate::config::Config;
use serde_json::Value;

const TOKEN_ENV: &str = "RG_KEY_DIRECTORY_TEST_TOKEN";
const TOKEN: &str = "key-directory-test-token-0123456789abcdef";
const KEYS: usize = 2_500;

fn gateway(shards: usize, driver: &str) -> ringgate::server::Running {
    common::quiet_logs();
    std::env::set_var(TOKEN_ENV, TOKEN);
    let text = format!(
        r#"
[server]
listen = "127.0.0.1:0"
shards = {shards}
pin = false
driver = "{driver}"

[admin]
listen = "127.0.0.1:0"
token_env = "{TOKEN_ENV}"

[[provider]]
name = "mock"
kind = "mock"

[[model]]
name = "gpt-4o-mini"
provider = "mock"

[[model]]
name = "other-model"
provider = "mock"
"#
    );
    ringgate::server::start(Config::parse(&text).unwrap()).unwrap()
}

fn admin_raw(method: &str, target: &str, body: &str) -> String {
    format!(
        "{method} {target} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// One keep-alive admin connection.
struct Admin {
    s: TcpStream,
    buf: Vec<u8>,
}

impl Admin {
    fn new(addr: SocketAddr) -> Admin {
        Admin {
            s: connect(addr),
            buf: Vec::new(),
        }
    }

    fn call(&mut self, method: &str, target: &str, body: &str) -> (u16, Value) {
        self.s
            .write_all(admin_raw(method, target, body).as_bytes())
            .unwrap();
        let r = read_response(&mut self.s, &mut self.buf)
            .unwrap_or_else(|| panic!("no admin response to {method} {target}"));
        let v = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
        (r.status, v)
    }

    /// Every page from the start with `limit` (`None`: the default): the names, page by page.
    fn walk(&mut self, limit: Option<usize>) -> Vec<Vec<String>> {
        let mut pages = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let mut q = Vec::new();
            if let Some(l) = limit {
                q.push(format!("limit={l}"));
            }
            if let Some(a) = &after {
                q.push(format!("after={}", a.replace('/', "%2F")));
            }
            let target = format!("/admin/keys?{}", q.join("&"));
            let (status, v) = self.call("GET", &target, "");
            assert_eq!(status, 200, "{target}: {v}");
            let names: Vec<String> = v["keys"]
                .as_array()
                .unwrap()
                .iter()
                .map(|k| k["name"].as_str().unwrap().to_string())
                .collect();
            let more = v["has_more"].as_bool().unwrap();
            assert_eq!(
                v["next_after"].as_str(),
                names.last().map(String::as_str).filter(|_| more),
                "{target}: next_after is the last name while more follow, else null"
            );
            after = v["next_after"].as_str().map(str::to_string);
            pages.push(names);
            if !more {
                return pages;
            }
            assert!(pages.len() <= KEYS + 10, "the walk does not end");
        }
    }
}

fn chat_status(main: SocketAddr, secret: &str, model: &str) -> u16 {
    let body = format!(r#"{{"model":"{model}","messages":[{{"role":"user","content":"hi"}}]}}"#);
    let raw = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {secret}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    request(main, raw.as_bytes()).status
}

/// Every answer for `secret` on `2 × shards` fresh connections (either shard).
fn statuses(gw: &ringgate::server::Running, secret: &str, model: &str) -> Vec<u16> {
    (0..2 * gw.shards)
        .map(|_| chat_status(gw.addr, secret, model))
        .collect()
}

#[test]
fn pages_walk_thousands_of_keys_once_and_each_change_works_on_every_shard() {
    for shards in [1, 2] {
        for driver in DRIVERS {
            let gw = gateway(shards, driver);
            let mut a = Admin::new(gw.admin_addr.unwrap());
            let mut secrets = Vec::new();
            for i in 0..KEYS {
                let (status, v) =
                    a.call("POST", "/admin/keys", &format!(r#"{{"name":"k{i:04}"}}"#));
                assert_eq!(status, 201, "{v}");
                secrets.push(v["key"].as_str().unwrap().to_string());
            }
            let all: Vec<String> = (0..KEYS).map(|i| format!("k{i:04}")).collect();
            // pages of 1000, of 7 and of the default: each key once, in creation order
            let pages = a.walk(Some(1000));
            let sizes: Vec<usize> = pages.iter().map(Vec::len).collect();
            assert_eq!(sizes, [1000, 1000, 500], "{shards} shard(s), {driver}");
            assert_eq!(pages.concat(), all);
            let pages = a.walk(Some(7));
            assert_eq!(
                (pages.len(), pages.concat()),
                (KEYS.div_ceil(7), all.clone())
            );
            let pages = a.walk(None);
            assert_eq!((pages[0].len(), pages.len()), (100, KEYS / 100));
            assert_eq!(pages.concat(), all);
            // the fields of each key are the ones a single key read shows
            let (_, one) = a.call("GET", "/admin/keys?limit=1&after=k0041", "");
            let (_, single) = a.call("GET", "/admin/keys/k0042", "");
            assert_eq!(one["keys"][0], single);
            // bounds and bad cursors: 400 with a message
            for bad in [
                "limit=0",
                "limit=1001",
                "limit=abc",
                "limit=-5",
                "after=nobody",
                "after=%zz",
                "after=k0001&after=k0002",
                "page=2",
            ] {
                // (an error answer ends the admin connection: a fresh one each)
                let raw = admin_raw("GET", &format!("/admin/keys?{bad}"), "");
                let r = request(gw.admin_addr.unwrap(), raw.as_bytes());
                let (status, v) = (r.status, r.json());
                assert_eq!(status, 400, "{bad}: {v}");
                assert!(v["error"]["message"].as_str().is_some(), "{bad}: {v}");
            }
            // a walk across changes: a revoked key drops out (its name still marks its place),
            // a key made meanwhile comes last
            let (status, _) = a.call("DELETE", "/admin/keys/k1000", "");
            assert_eq!(status, 200);
            let (_, v) = a.call("GET", "/admin/keys?limit=2&after=k0999", "");
            assert_eq!(
                (v["keys"][0]["name"].as_str(), v["keys"][1]["name"].as_str()),
                (Some("k1001"), Some("k1002"))
            );
            let (_, v) = a.call("GET", "/admin/keys?limit=1&after=k1000", "");
            assert_eq!(v["keys"][0]["name"], "k1001");
            let (status, v) = a.call(
                "POST",
                "/admin/keys",
                r#"{"name":"late/one","models":["gpt-4o-mini"]}"#,
            );
            assert_eq!(status, 201, "{v}");
            let late = v["key"].as_str().unwrap().to_string();
            let pages = a.walk(Some(1000));
            let mut want: Vec<String> = all.iter().filter(|n| *n != "k1000").cloned().collect();
            want.push("late/one".into());
            assert_eq!(pages.concat(), want);
            let (_, v) = a.call("GET", "/admin/keys?after=k2499", "");
            assert_eq!(
                (v["keys"][0]["name"].as_str(), v["has_more"].as_bool()),
                (Some("late/one"), Some(false))
            );
            // on the request path, every shard: the first, last, revoked and newest keys
            let (status, _) = a.call(
                "PATCH",
                "/admin/keys/k0000",
                r#"{"models":["other-model"]}"#,
            );
            assert_eq!(status, 200);
            let ok = vec![200; 2 * shards];
            assert_eq!(
                statuses(&gw, &secrets[2_499], "gpt-4o-mini"),
                ok,
                "{shards}, {driver}"
            );
            assert_eq!(statuses(&gw, &secrets[0], "other-model"), ok);
            assert_eq!(
                statuses(&gw, &secrets[0], "gpt-4o-mini"),
                vec![403; 2 * shards]
            );
            assert_eq!(
                statuses(&gw, &secrets[1_000], "gpt-4o-mini"),
                vec![401; 2 * shards]
            );
            assert_eq!(statuses(&gw, &late, "gpt-4o-mini"), ok);
            gw.stop();
        }
    }
}
