//! The standalone mock server behind `ringgate mock --listen ADDR --profile P`: the same shard
//! machinery as the gateway, answering each dialect's standard path.
//!
//! Owns: the mock's accept loop and path dispatch. Must not: share state with the gateway.

use std::cell::Cell;
use std::io;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;

use super::{chat, MockRequest, Profile};
use crate::error::{Error, ErrorShape, Kind};
use crate::http::body::read_body;
use crate::http::conn::{ClientConn, Limits};
use crate::http::head::Method;
use crate::http::io::deadline;
use crate::shard::{self, DriverChoice};
use crate::shutdown::{LocalSignal, Shutdown};

pub struct MockServer {
    pub addr: SocketAddr,
    pub shutdown: Shutdown,
    handles: Vec<std::thread::JoinHandle<()>>,
}

impl MockServer {
    pub fn stop(self) {
        self.shutdown.fire();
        for h in self.handles {
            let _ = h.join();
        }
    }

    pub fn wait(self) {
        for h in self.handles {
            let _ = h.join();
        }
    }
}

const LIMITS: Limits = Limits {
    max_head: 64 * 1024,
    max_headers: 100,
    header_timeout: Duration::from_secs(10),
    body_timeout: Duration::from_secs(60),
    idle_timeout: Duration::from_secs(120),
    write_timeout: Duration::from_secs(60),
};
const MAX_BODY: u64 = 256 * 1024 * 1024;

pub fn start(
    listen: SocketAddr,
    profile: Profile,
    shards: usize,
    driver: DriverChoice,
) -> io::Result<MockServer> {
    let (listeners, addr) = shard::bind_listeners(listen, shards)?;
    let shutdown = Shutdown::new();
    let sd = shutdown.clone();
    let handles = shard::spawn(
        listeners,
        driver,
        false,
        move |_id, std_listener, _driver| {
            let sd = sd.clone();
            async move {
                let listener = match monoio::net::TcpListener::from_std(std_listener) {
                    Ok(l) => l,
                    Err(e) => {
                        crate::log::info(format_args!("mock: listener: {e}"));
                        return;
                    }
                };
                let mut stop = std::pin::pin!(sd.wait());
                let local = Rc::new(Local::default());
                loop {
                    monoio::select! {
                        _ = &mut stop => break,
                        r = listener.accept() => match r {
                            Ok((stream, _)) => {
                                monoio::spawn(serve(ClientConn::new(stream), profile, local.clone()));
                            }
                            Err(_) => monoio::time::sleep(Duration::from_millis(5)).await,
                        }
                    }
                }
                // Close idle connections and let in-flight answers finish, as a process exit would.
                local.draining.fire();
                drop(listener);
                let until = std::time::Instant::now() + Duration::from_secs(5);
                while local.conns.get() > 0 && std::time::Instant::now() < until {
                    monoio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        },
    )?;
    Ok(MockServer {
        addr,
        shutdown,
        handles,
    })
}

#[derive(Default)]
struct Local {
    draining: LocalSignal,
    conns: Cell<usize>,
}

async fn serve(conn: ClientConn, profile: Profile, local: Rc<Local>) {
    local.conns.set(local.conns.get() + 1);
    serve_conn(conn, profile, &local).await;
    local.conns.set(local.conns.get() - 1);
}

async fn serve_conn(mut conn: ClientConn, profile: Profile, local: &Local) {
    loop {
        let next = monoio::select! {
            _ = local.draining.wait() => return,
            h = conn.read_head(&LIMITS) => h,
        };
        let head = match next {
            Ok(Some(h)) => h,
            Ok(None) => return,
            Err(e) => {
                conn.respond_error(&e, ErrorShape::OpenAi, false, LIMITS.write_timeout)
                    .await;
                return;
            }
        };
        let keep_alive = head.keep_alive;
        let method = head.method;
        let is_chat = head.path(&conn.buf) == b"/v1/chat/completions";
        let is_models = head.path(&conn.buf) == b"/v1/models";
        let body = match read_body(
            &mut conn.stream,
            &mut conn.buf,
            head.len,
            head.body,
            MAX_BODY,
            deadline(LIMITS.body_timeout.as_millis() as u64),
            None,
        )
        .await
        {
            Ok(b) => b,
            Err(e) => {
                conn.respond_error(&e, ErrorShape::OpenAi, false, LIMITS.write_timeout)
                    .await;
                return;
            }
        };
        let ok = match (method, is_chat, is_models) {
            (Method::Post, true, _) => match MockRequest::parse(&body) {
                Ok(req) => chat::respond(&mut conn.stream, &req, profile, keep_alive)
                    .await
                    .is_ok(),
                Err(msg) => {
                    let e = Error::new(Kind::InvalidBody, msg);
                    conn.respond_error(&e, ErrorShape::OpenAi, keep_alive, LIMITS.write_timeout)
                        .await
                }
            },
            (Method::Get, _, true) => {
                let body = br#"{"object":"list","data":[{"id":"mock","object":"model","created":1700000000,"owned_by":"ringgate-mock"}]}"#;
                conn.respond(
                    200,
                    b"application/json",
                    b"",
                    body,
                    keep_alive,
                    LIMITS.write_timeout,
                )
                .await
            }
            _ => {
                let e = Error::new(Kind::NotFound, "the mock does not serve this path");
                conn.respond_error(&e, ErrorShape::OpenAi, keep_alive, LIMITS.write_timeout)
                    .await
            }
        };
        if !ok || !keep_alive {
            return;
        }
    }
}
