//! One client request's attempt plan: which (deployment, key) to try next.
//!
//! Order: the requested model's deployments (balanced, see `balance`), then each fallback
//! model's deployments (`Route::chain`: `fallbacks` in order, then theirs, breadth-first).
//! A deployment is tried at most once per request, skipped while its breaker is open or while
//! every key of its provider cools down for that deployment's model (`keys`: a cooldown is
//! key × model unless the provider limited the whole key). When no fresh candidate is left, a
//! deployment that was skipped or answered 429 only because of key cooldowns is tried again as
//! soon as a key is free: at once if one is, else `Step::Wait` until the soonest key is free —
//! only while the request's total wait stays within its model's `max_retry_wait_ms` (default
//! 1 s) and the attempt after the wait still gets its whole first-byte timeout (at most half
//! the deadline) before the deadline. Otherwise the plan stops and the client gets the 429 at
//! once, with the upstream's `Retry-After` (a `Retry-After: 7` is the client's to wait, with
//! its own retries, not the gateway's).
//! Bounded by the requested model's `max_attempts` and deadline; its `retry_on` decides which
//! failures are retried. Breaker settings are each deployment's own model's.
//!
//! Owns: `Attempts`, `Candidate` (a guard: dropping it ends the attempt's in-flight count and
//! frees an unanswered half-open probe), `Step`, `Stop`.
//! Must not: do IO or sleep (`Step::Wait` tells the caller to), or read clocks.

use std::cell::Cell;
use std::time::{Duration, Instant};

use smallvec::SmallVec;

use super::keys::KeyPick;
use super::{ForwardState, ModelState};
use crate::config::policy::{Fallback, Reason};
use crate::route::{Deployment, Route, RouteTable};

/// What to do next.
#[derive(Debug)]
pub enum Step<'a> {
    /// Send the request to this candidate now.
    Try(Candidate<'a>),
    /// Nothing to try until `Instant` (a key cooling down, before the deadline): sleep until
    /// then and call `Attempts::next` again.
    Wait(Instant),
    /// No more attempts; answer the client with the last failure (or relay the last upstream
    /// answer if it had one).
    Stop(Stop),
}

/// Why a plan ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// The failure's reason is not in `retry_on`.
    NotRetryable(Reason),
    /// `max_attempts` reached.
    Attempts,
    /// The overall deadline passed.
    Deadline,
    /// No candidate left: every deployment tried, its breaker open, or its keys cooling past
    /// the deadline. With `Attempts::attempts() == 0`: nothing was available at all.
    Exhausted,
    /// `lb = "load"`: every deployment is full (`max_waiting` / `max_in_flight`) and nothing
    /// was sent: shed with 429 + Retry-After.
    Full,
}

/// One attempt: where to send it. Report its outcome with `Attempts::succeeded` or
/// `Attempts::failed`; drop it when the response (body or stream) has ended — that ends its
/// in-flight count for p2c.
#[derive(Debug)]
pub struct Candidate<'a> {
    /// The model whose deployment this is (the requested one, or a fallback).
    pub route: &'a Route,
    pub deployment: &'a Deployment,
    /// Index into `route.deployments`.
    pub deployment_index: usize,
    /// Index into `deployment.provider.keys` (see `Provider::key_auth`).
    pub key: usize,
    /// The deployment's cooldown scope in its provider's `KeyRing` (`ModelState::scopes`).
    pub scope: usize,
    /// 1-based attempt number within the request (for `x-ringgate-attempts`).
    pub attempt: u32,
    /// `Some` when this attempt serves a fallback model.
    pub fallback: Option<&'a Fallback>,
    /// The model name to send upstream (splice when it differs from the client's).
    pub upstream_model: &'a str,
    /// When the attempt was handed out (latency is measured from here).
    pub started: Instant,
    state: &'a ModelState,
    probe: bool,
    settled: Cell<bool>,
}

impl Candidate<'_> {
    /// Auth header lines for this attempt's key.
    pub fn auth_headers(&self) -> &[u8] {
        self.deployment.provider.key_auth(self.key)
    }
}

impl Drop for Candidate<'_> {
    fn drop(&mut self) {
        self.state.balancer.end(self.deployment_index);
        if let Some(cell) = &self.deployment.provider.engine {
            cell.end();
        }
        if self.probe && !self.settled.get() {
            if let Some(b) = self.state.breakers.get(self.deployment_index) {
                b.release_probe();
            }
        }
    }
}

/// The attempt plan of one client request. Borrow the shard's table and state for the
/// request's duration.
#[derive(Debug)]
pub struct Attempts<'a> {
    table: &'a RouteTable,
    state: &'a ForwardState,
    route: &'a Route,
    requested: &'a str,
    deadline: Instant,
    attempts: u32,
    /// (route index, deployment index) already tried.
    tried: SmallVec<[(usize, usize); 8]>,
    /// Tried deployments that answered 429 (may be tried again once a key is free).
    limited: SmallVec<[(usize, usize); 4]>,
    /// Stage of the last attempt (0: requested model, k: `route.chain[k - 1]`).
    last_stage: Option<usize>,
    /// `lb = "load"`: the prompt's block hashes (prefix affinity) and estimated tokens.
    blocks: crate::engine::prefix::Blocks,
    tokens: u64,
    /// A `load` stage found every deployment full.
    full: bool,
    /// Time handed out in `Step::Wait`s so far (bounded by `max_retry_wait`).
    waited: Duration,
}

impl<'a> Attempts<'a> {
    /// The attempts of `call` (its routing, route and model; its plan's deadline counts from
    /// `call.start`).
    pub fn for_call(call: &super::call::Call<'a>) -> Attempts<'a> {
        let (routing, model) = (call.routing, call.fields.model.as_str());
        Attempts::new(
            &routing.routes,
            &routing.forward,
            call.route,
            model,
            call.start,
        )
    }

    /// A plan for a request that asked for `requested` and resolved to `route`, starting at
    /// `now` (the deadline counts from here).
    pub fn new(
        table: &'a RouteTable,
        state: &'a ForwardState,
        route: &'a Route,
        requested: &'a str,
        now: Instant,
    ) -> Attempts<'a> {
        Attempts {
            table,
            state,
            route,
            requested,
            deadline: now + route.policy.deadline,
            attempts: 0,
            tried: SmallVec::new(),
            limited: SmallVec::new(),
            last_stage: None,
            blocks: Default::default(),
            tokens: 0,
            full: false,
            waited: Duration::ZERO,
        }
    }

    /// The request's prompt for `lb = "load"`: block hashes (`engine::prefix`) and estimated
    /// prompt tokens (counted toward the engine's reserved tokens).
    pub fn set_prompt(&mut self, blocks: crate::engine::prefix::Blocks, tokens: u64) {
        self.blocks = blocks;
        self.tokens = tokens;
    }

    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// How long the next attempt may wait for its response head: the first-byte timeout,
    /// capped by what is left of the deadline.
    pub fn attempt_timeout(&self, now: Instant) -> Duration {
        self.route
            .policy
            .first_byte_timeout
            .min(self.deadline.saturating_duration_since(now))
    }

    fn stage(&self, s: usize) -> Option<(&'a Route, Option<&'a Fallback>)> {
        if s == 0 {
            return Some((self.route, None));
        }
        let f = self.route.chain.get(s - 1)?;
        Some((self.table.route(f.route)?, Some(f)))
    }

    fn stages(&self) -> usize {
        self.route.chain.len() + 1
    }

    /// The first or next candidate.
    pub fn next(&mut self, now: Instant) -> Step<'a> {
        self.full = false;
        if self.attempts >= self.route.policy.max_attempts {
            return Step::Stop(Stop::Attempts);
        }
        if now >= self.deadline {
            return Step::Stop(Stop::Deadline);
        }
        let st = self.state;
        // Fresh deployments, stage by stage.
        for s in 0..self.stages() {
            let Some((r, _)) = self.stage(s) else {
                continue;
            };
            let Some(ms) = st.model(r.index) else {
                continue;
            };
            let eligible = |d: usize| {
                !self.tried.contains(&(r.index, d))
                    && ms.breakers.get(d).is_some_and(|b| b.available(now))
                    && r.deployments.get(d).is_some_and(|dep| {
                        let scope = ms.scopes.get(d).copied().unwrap_or(0);
                        st.key_ready(dep.provider.index, scope, now)
                    })
            };
            let picked = match &ms.load {
                None => ms.balancer.pick(now, st.rng(), eligible),
                Some(load) => {
                    let ms_now = crate::engine::signal::ms_of(now);
                    let inflight = |d| ms.balancer.in_flight(d);
                    match load.pick(ms_now, &self.blocks, st.rng(), eligible, inflight) {
                        crate::engine::load::LoadPick::Pick(d) => Some(d),
                        crate::engine::load::LoadPick::Full => {
                            self.full = true;
                            None
                        }
                        crate::engine::load::LoadPick::None => None,
                    }
                }
            };
            if let Some(d) = picked {
                if let Some(c) = self.launch(s, d, now) {
                    return Step::Try(c);
                }
            }
        }
        if self.full && self.attempts == 0 {
            // shed: every deployment of a load-balanced stage is full and nothing else is free
            return Step::Stop(Stop::Full);
        }
        // Deployments held back only by key cooldowns.
        let mut soonest: Option<Instant> = None;
        for s in 0..self.stages() {
            let Some((r, _)) = self.stage(s) else {
                continue;
            };
            let Some(ms) = st.model(r.index) else {
                continue;
            };
            for (d, dep) in r.deployments.iter().enumerate() {
                let id = (r.index, d);
                if (self.tried.contains(&id) && !self.limited.contains(&id))
                    || !ms.breakers.get(d).is_some_and(|b| b.available(now))
                {
                    continue;
                }
                let scope = ms.scopes.get(d).copied().unwrap_or(0);
                match st.keys(dep.provider.index).map(|k| k.peek(now, scope)) {
                    Some(KeyPick::Cooling { until, .. }) => {
                        soonest = Some(soonest.map_or(until, |s| s.min(until)));
                    }
                    // a load-balanced deployment the picker passed over is full or out
                    _ if ms.load.is_some() && !self.limited.contains(&id) => {}
                    _ => {
                        self.limited.retain(|l| *l != id);
                        if let Some(c) = self.launch(s, d, now) {
                            return Step::Try(c);
                        }
                    }
                }
            }
        }
        match soonest {
            Some(until) if until + self.after_wait() <= self.deadline => {
                let wait = until.saturating_duration_since(now);
                if self.waited + wait > self.route.policy.max_retry_wait {
                    // the client's to wait (with the upstream's Retry-After), not ours
                    return Step::Stop(Stop::Exhausted);
                }
                self.waited += wait;
                Step::Wait(until)
            }
            _ => Step::Stop(Stop::Exhausted),
        }
    }

    /// Time that must be left before the deadline when a wait for a cooling key ends: the
    /// attempt after the wait gets its whole first-byte timeout (at most half the deadline).
    /// A shorter remainder would turn the provider's 429 into a first-byte timeout (504)
    /// after the client's time was spent waiting.
    fn after_wait(&self) -> Duration {
        self.route
            .policy
            .first_byte_timeout
            .min(self.route.policy.deadline / 2)
    }

    fn launch(&mut self, s: usize, d: usize, now: Instant) -> Option<Candidate<'a>> {
        let (r, fallback) = self.stage(s)?;
        let st = self.state;
        let ms = st.model(r.index)?;
        let dep = r.deployments.get(d)?;
        let breaker = ms.breakers.get(d)?;
        let id = (r.index, d);
        if !self.tried.contains(&id) {
            self.tried.push(id);
        }
        let was_closed = breaker.state() == super::breaker::BreakerState::Closed;
        if !breaker.allow(now) {
            return None;
        }
        let scope = ms.scopes.get(d).copied().unwrap_or(0);
        let key = match st.keys(dep.provider.index).map(|k| k.pick(now, scope)) {
            Some(KeyPick::Ready(k)) | Some(KeyPick::Cooling { key: k, .. }) => k,
            None => 0,
        };
        ms.balancer.start(d);
        if let Some(cell) = &dep.provider.engine {
            cell.start(self.tokens);
        }
        if let Some(load) = &ms.load {
            load.routed(d, &self.blocks, crate::engine::signal::ms_of(now));
        }
        self.attempts += 1;
        st.metrics.attempt(r.index, d);
        if s > 0 && self.last_stage != Some(s) {
            st.metrics.fallback(self.route.index, s - 1);
        }
        self.last_stage = Some(s);
        let requested = fallback.map_or(self.requested, |f| f.name.as_str());
        Some(Candidate {
            route: r,
            deployment: dep,
            deployment_index: d,
            key,
            scope,
            attempt: self.attempts,
            fallback,
            upstream_model: dep.upstream_model_or(requested),
            started: now,
            state: ms,
            probe: !was_closed,
            settled: Cell::new(false),
        })
    }

    /// The candidate answered (its response head arrived) with a status that is not a
    /// failure (`Reason::from_status` is `None`: 2xx, 3xx, 4xx other than 429). Records the
    /// latency and closes a half-open breaker. Keep the candidate until the response ended.
    pub fn succeeded(&self, cand: &Candidate<'a>, now: Instant) {
        if cand.settled.replace(true) {
            return;
        }
        let latency = now.saturating_duration_since(cand.started);
        cand.state
            .balancer
            .observe(cand.deployment_index, now, latency);
        if let Some(b) = cand.state.breakers.get(cand.deployment_index) {
            b.on_success(now, latency);
        }
    }

    /// The candidate failed for `reason` before anything reached the client. A 429 cools its
    /// key for its model for `retry_after` (parse it with `keys::parse_retry_after`) and is no
    /// breaker verdict; other reasons count against its breaker and its latency estimate.
    /// Returns what to do next: `Stop` if the reason is not retryable or nothing is left (then
    /// relay the failed answer, if there was one, or the error).
    pub fn failed(
        &mut self,
        cand: Candidate<'a>,
        reason: Reason,
        retry_after: Option<Duration>,
        now: Instant,
    ) -> Step<'a> {
        self.failed_scoped(cand, reason, retry_after, false, now)
    }

    /// As `failed`; a 429 with `whole_key` (`scope::whole_key`) cools the key for every model.
    pub fn failed_scoped(
        &mut self,
        cand: Candidate<'a>,
        reason: Reason,
        retry_after: Option<Duration>,
        whole_key: bool,
        now: Instant,
    ) -> Step<'a> {
        cand.settled.set(true);
        let (r, d) = (cand.route.index, cand.deployment_index);
        let st = self.state;
        st.metrics.failure(r, d, reason);
        if reason == Reason::Status429 {
            let provider = cand.deployment.provider.index;
            if let Some(k) = st.keys(provider) {
                k.cool(cand.key, cand.scope, whole_key, now, retry_after);
                st.metrics.key_cooldown(provider);
            }
            if !self.limited.contains(&(r, d)) {
                self.limited.push((r, d));
            }
            // The deployment answered: a half-open probe gets no verdict, the next one may go.
            if cand.probe {
                if let Some(b) = cand.state.breakers.get(d) {
                    b.release_probe();
                }
            }
        } else if reason.trips_breaker() {
            let elapsed = now.saturating_duration_since(cand.started);
            cand.state.balancer.observe_failure(d, now, elapsed);
            if cand
                .state
                .breakers
                .get(d)
                .is_some_and(|b| b.on_failure(now))
            {
                st.metrics.breaker_opened(r, d);
            }
        }
        drop(cand);
        if !self.route.policy.retryable(reason) {
            return Step::Stop(Stop::NotRetryable(reason));
        }
        let step = self.next(now);
        if !matches!(step, Step::Stop(_)) {
            st.metrics.retry(self.route.index, reason);
        }
        step
    }
}

#[cfg(test)]
#[path = "attempts_tests.rs"]
mod tests;
