//! Timing and framing shared by every mock dialect: non-stream bodies after the profile's delay,
//! and SSE streams whose head events go out with the headers and whose content units are spread
//! over the profile's span (first unit at the first-token delay).
//!
//! Owns: the `Events` contract between a dialect writer and the pacer, HTTP heads and chunk
//! framing of mock answers. Must not: know any dialect's event names or JSON.

use std::io;
use std::time::{Duration, Instant};

use monoio::io::AsyncWriteRent;

use super::Profile;
use crate::http::io::write_all;
use crate::http::response::{write_chunk, write_head, Framing, LAST_CHUNK};

/// At most this many SSE writes per stream (units are batched into frames beyond that).
const MAX_FRAMES: u32 = 50;

/// A dialect's stream, cut into paced content units.
pub trait Events {
    /// Events sent with the response head, before any content.
    fn head(&mut self, out: &mut Vec<u8>);
    /// Number of content units (at least 1).
    fn units(&self) -> u32;
    /// Append the events of unit `i`; called once per unit, in order.
    fn unit(&mut self, i: u32, out: &mut Vec<u8>);
    /// Events after the last unit (terminal events included).
    fn tail(&mut self, out: &mut Vec<u8>);
}

/// The whole SSE transcript without pacing.
pub fn transcript<E: Events + ?Sized>(ev: &mut E) -> Vec<u8> {
    let mut out = Vec::new();
    ev.head(&mut out);
    for i in 0..ev.units() {
        ev.unit(i, &mut out);
    }
    ev.tail(&mut out);
    out
}

/// Write a complete JSON response (a 200 after the profile's first-token delay, errors at once).
pub async fn json<S: AsyncWriteRent>(
    s: &mut S,
    status: u16,
    body: &[u8],
    profile: Profile,
    keep_alive: bool,
) -> io::Result<()> {
    let delay = if status == 200 {
        profile.first_token_delay()
    } else {
        Duration::ZERO
    };
    if !delay.is_zero() {
        monoio::time::sleep(delay).await;
    }
    let mut out = Vec::with_capacity(160 + body.len());
    write_head(
        &mut out,
        status,
        b"application/json",
        Framing::Length(body.len()),
        keep_alive,
        b"x-request-id: mock\r\n",
    );
    out.extend_from_slice(body);
    write_all(s, out).await.0
}

/// Write a complete SSE response: head events at once, units paced by `profile`.
pub async fn stream<S: AsyncWriteRent, E: Events + ?Sized>(
    s: &mut S,
    ev: &mut E,
    profile: Profile,
    keep_alive: bool,
) -> io::Result<()> {
    let delay = profile.first_token_delay();
    let mut out = sse_head(4096, keep_alive);
    let mut buf = Vec::with_capacity(1024);
    ev.head(&mut buf);
    let n = ev.units().max(1);
    if profile == Profile::Instant {
        for i in 0..n {
            ev.unit(i, &mut buf);
        }
        ev.tail(&mut buf);
        write_chunk(&mut out, &buf);
        out.extend_from_slice(LAST_CHUNK);
        return write_all(s, out).await.0;
    }
    write_chunk(&mut out, &buf);
    let (r, mut out) = write_all(s, out).await;
    r?;
    let start = Instant::now();
    let gap = profile.unit_gap();
    let frames = if gap.is_some() { n } else { n.min(MAX_FRAMES) };
    let span = profile.stream_span();
    let mut sent = 0u32;
    for f in 0..frames {
        let at = match gap {
            Some(g) => delay + g * f,
            None => delay + span.mul_f64(f64::from(f) / f64::from(frames)),
        };
        let wait = (start + at).saturating_duration_since(Instant::now());
        if wait > Duration::ZERO {
            monoio::time::sleep(wait).await;
        }
        let upto = ((u64::from(n) * u64::from(f + 1)) / u64::from(frames)) as u32;
        buf.clear();
        for i in sent..upto {
            ev.unit(i, &mut buf);
        }
        sent = upto;
        let last = f + 1 == frames;
        if last {
            ev.tail(&mut buf);
        }
        write_chunk(&mut out, &buf);
        if last {
            out.extend_from_slice(LAST_CHUNK);
        }
        let (r, back) = write_all(s, out).await;
        r?;
        out = back;
    }
    Ok(())
}

/// A buffer of `capacity` holding the head of a 200 SSE answer (chunked, not to be cached).
pub fn sse_head(capacity: usize, keep_alive: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(capacity);
    let lines = b"cache-control: no-cache\r\nx-request-id: mock\r\n";
    write_head(
        &mut out,
        200,
        b"text/event-stream",
        Framing::Chunked,
        keep_alive,
        lines,
    );
    out
}

/// Append one SSE event with an `event:` line (Responses, Anthropic).
pub fn named_event(out: &mut Vec<u8>, name: &str) {
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b"\ndata: ");
}
