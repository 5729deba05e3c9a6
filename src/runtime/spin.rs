//! Idle spin (`[server] idle_spin_us`, off by default): after a request starts or ends, the
//! shard's event loop keeps polling its ring (io_uring) or epoll set without sleeping for a
//! short, adaptive budget, so the next packet finds the thread running instead of paying a
//! wake-up (on a VM, a halted vCPU's wake-up is tens of µs). For an appliance that owns its
//! core; it burns that core while traffic flows, and nothing once traffic stops.
//!
//! How: a spinner task per shard that, while spinning, yields back to the runtime each turn
//! (woken again by a second, tiny bouncer task so it queues behind the tasks that turn woke).
//! A runtime with a ready task does not sleep: it submits and reaps completions without
//! waiting (`io_uring_enter` without a wait, `epoll_wait(0)`), then runs the spinner again.
//! Every ~2 ms of continuous spinning the spinner waits on an already-expired timer once: the
//! runtime then parks with a zero timeout, which also fires every due timer (monoio's timer
//! wheel only turns in `park`), so request timeouts stay as punctual as without spinning.
//!
//! Budget: spinning stops after `budget` without a request starting or ending (`touch`), and
//! the spinner parks until the next `touch`. The budget adapts: when the gap that ended a park
//! was short enough that spinning the configured maximum would have covered it, the budget
//! doubles (up to the maximum); when it was longer, it halves (down to 1/16 of it) — so a
//! trickle of traffic with long gaps costs little spinning per request.
//!
//! Owns: the spinner task, its budget, and the per-thread activity mark. Must not: do any I/O
//! of its own, or hold anything a request needs. Off (the default), `touch` is one untaken
//! branch on a thread-local flag.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

thread_local! {
    /// Whether this thread runs a spinner (set once by `run`).
    static ENABLED: Cell<bool> = const { Cell::new(false) };
    /// Requests started + ended on this thread: the spinner's sign of traffic.
    static ACTIVITY: Cell<u64> = const { Cell::new(0) };
    /// The spinner, while it is parked waiting for traffic.
    static PARKED: Cell<Option<Waker>> = const { Cell::new(None) };
    /// The spinner, while it yields one turn to the runtime (the bouncer wakes it).
    static SPINNER: Cell<Option<Waker>> = const { Cell::new(None) };
    /// The bouncer task, waiting for the spinner to yield.
    static BOUNCER: Cell<Option<Waker>> = const { Cell::new(None) };
}

/// Every this much continuous spinning, let the runtime park once with a zero timeout so the
/// timer wheel turns (its resolution is 1 ms; a spin never delays a timeout by more than this).
const TIMER_TURN: Duration = Duration::from_millis(2);

/// A request started or ended on this thread. Cheap: a flag test when spinning is off.
#[inline]
pub fn touch() {
    if ENABLED.with(Cell::get) {
        ACTIVITY.with(|a| a.set(a.get().wrapping_add(1)));
        if let Some(w) = PARKED.with(Cell::take) {
            w.wake();
        }
    }
}

fn activity() -> u64 {
    ACTIVITY.with(Cell::get)
}

/// The adaptive budget: between `max / 16` and `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    max: Duration,
    now: Duration,
}

impl Budget {
    pub fn new(max: Duration) -> Self {
        Budget { max, now: max }
    }

    pub fn get(&self) -> Duration {
        self.now
    }

    /// A park ended: the traffic came back `gap` after the spinning stopped, having spun
    /// `spun` before it. Had spinning lasted the maximum, would it have caught it?
    pub fn after_gap(&mut self, spun: Duration, gap: Duration) {
        let floor = self.max / 16;
        if spun.saturating_add(gap) <= self.max {
            self.now = self.now.saturating_mul(2).min(self.max);
        } else {
            self.now = (self.now / 2).max(floor);
        }
    }
}

/// The spinner: runs for the shard's lifetime (spawn it on the shard's runtime).
pub async fn run(max: Duration) {
    if max.is_zero() {
        return;
    }
    ENABLED.with(|e| e.set(true));
    monoio::spawn(bouncer());
    let mut budget = Budget::new(max);
    // idle time spun before the last park (none before the first)
    let mut spun = Duration::ZERO;
    loop {
        // 1. park until traffic
        let parked_at = Instant::now();
        Parked { seen: activity() }.await;
        budget.after_gap(spun, parked_at.elapsed());
        // 2. spin while traffic keeps coming
        spun = budget.get();
        spin(spun).await;
    }
}

/// Spin until `budget` passes without `touch`.
async fn spin(budget: Duration) {
    let mut seen = activity();
    let mut last = Instant::now();
    let (mut turn_at, mut turn) = timer_turn();
    register(turn.as_mut()).await;
    loop {
        YieldNow(false).await;
        let now = Instant::now();
        let a = activity();
        if a != seen {
            seen = a;
            last = now;
        } else if now.saturating_duration_since(last) >= budget {
            return;
        }
        if now >= turn_at + Duration::from_millis(1) {
            // registered before it expired and now due by a whole wheel tick: waiting on it
            // makes the runtime park with a zero timeout and turn the wheel
            turn.as_mut().await;
            (turn_at, turn) = timer_turn();
            register(turn.as_mut()).await;
        }
    }
}

/// A timer `TIMER_TURN` from now.
fn timer_turn() -> (Instant, Pin<Box<monoio::time::Sleep>>) {
    let at = Instant::now() + TIMER_TURN;
    let sleep = monoio::time::sleep_until(monoio::time::Instant::from_std(at));
    (at, Box::pin(sleep))
}

/// Poll `sleep` once so it sits in the timer wheel (a timer first polled after its deadline
/// completes at once, without the wheel turning).
async fn register(mut sleep: Pin<&mut monoio::time::Sleep>) {
    std::future::poll_fn(|cx| {
        let _ = sleep.as_mut().poll(cx);
        Poll::Ready(())
    })
    .await
}

/// Pending until a `touch` after `seen`.
struct Parked {
    seen: u64,
}

impl Future for Parked {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if activity() != self.seen {
            return Poll::Ready(());
        }
        PARKED.with(|p| p.set(Some(cx.waker().clone())));
        Poll::Pending
    }
}

/// Pending once, then ready: hands the thread back to the runtime for one non-blocking turn of
/// its driver. The wake comes from the bouncer task, never from the spinner's own poll: monoio
/// puts a task that wakes itself while running at the *front* of its queue, which would run
/// the spinner again ahead of the connections its driver turn just woke.
struct YieldNow(bool);

impl Future for YieldNow {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0 {
            return Poll::Ready(());
        }
        self.0 = true;
        match BOUNCER.with(Cell::take) {
            Some(b) => {
                SPINNER.with(|s| s.set(Some(cx.waker().clone())));
                b.wake();
            }
            // the bouncer has not run yet: wake ourselves (first turn only)
            None => cx.waker().wake_by_ref(),
        }
        Poll::Pending
    }
}

/// The bouncer: each time the spinner yields, wake it back from here (a wake from another task
/// queues it behind the tasks already woken).
async fn bouncer() {
    std::future::poll_fn(|cx| {
        if let Some(s) = SPINNER.with(Cell::take) {
            s.wake();
        }
        BOUNCER.with(|b| b.set(Some(cx.waker().clone())));
        Poll::<()>::Pending
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_grows_on_short_gaps_and_shrinks_on_long_ones() {
        let max = Duration::from_micros(160);
        let mut b = Budget::new(max);
        b.after_gap(Duration::ZERO, Duration::from_millis(5));
        assert_eq!(b.get(), Duration::from_micros(80));
        for _ in 0..10 {
            b.after_gap(Duration::ZERO, Duration::from_millis(5));
        }
        assert_eq!(b.get(), Duration::from_micros(10), "floor is max / 16");
        b.after_gap(Duration::from_micros(10), Duration::from_micros(100));
        assert_eq!(b.get(), Duration::from_micros(20));
        for _ in 0..10 {
            b.after_gap(Duration::from_micros(10), Duration::from_micros(100));
        }
        assert_eq!(b.get(), max, "ceiling is max");
    }
}
