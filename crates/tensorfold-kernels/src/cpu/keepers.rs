//! Keeps the pool's other workers awake and stealing for the length of one forward, as OpenMP's spinning threads do.
//!
//! Between a forward's parallel calls (a layer has several, a decode step about a hundred) rayon's idle workers
//! yield a few times, then sleep on a futex; the next call wakes them with a syscall, and on a virtual machine the
//! wake takes longer than a one-row linear's half. A `perf` profile of one-stream decode on the 8B plan put about
//! 6% of a step in those sleeps and wakes (`docs/receipts/2026-12-07-cpu-keepers.md`). A keeper is a job broadcast to
//! every worker that steals and runs pool work (the forward's forks; also any job injected into the pool, which the
//! scope's end then waits for, as any rayon wait would) until the forward ends, so the workers holding one do not
//! sleep. A keeper the forward's own thread takes, or one run from inside another keeper, ends at once, and one ends
//! for the rest of the forward when a second forward starts: some worker may then sleep between calls, as without
//! keepers.
//!
//! A keeper never holds its thread for long: after [`IDLE_ROUNDS`] idle looks in a row (a look that found nothing,
//! or whose job ran a keeper) it queues itself again and returns.
//! A worker may take a keeper while it waits inside a fork it stole (a join whose other half is elsewhere); returning
//! lets that fork see its join done and go on, where a keeper that spun until the forward ended would wait on the
//! fork below it for ever.
//!
//! Keepers only change which thread runs a fork, never what a fork computes: the bits are those of any other
//! schedule (work is split by output, never inside a reduction). They spin only while one forward runs alone and
//! the pool has no more threads than the host has cores; otherwise the forward runs as a plain scope.

use std::cell::Cell;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Forwards running on the CPU pools now (tests may run several at once); keepers spin only while it is one, so
/// several forwards never spin on each other's cores.
static RUNNING: AtomicUsize = AtomicUsize::new(0);

/// Runs `f` in a scope on the current pool (the caller is a worker or is handed to one), with keepers broadcast to
/// the pool's workers while `f` runs, when it runs alone and the pool fits the cores (else a plain scope).
/// Panics in `f` propagate after the keepers stop.
pub(super) fn kept_scope<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    let _running = Running::enter();
    let alone = RUNNING.load(Ordering::Acquire) == 1;
    if !alone || !spinning_fits(rayon::current_num_threads()) {
        return rayon::scope(|_| f());
    }
    let done = AtomicBool::new(false);
    let owner = AtomicUsize::new(usize::MAX);
    rayon::scope(|s| {
        // The body's thread (a worker even when the caller is not one): its copy of the broadcast must not spin.
        owner.store(rayon::current_thread_index().unwrap_or(usize::MAX), Ordering::Release);
        s.spawn_broadcast(|s, _| keep(s, &done, owner.load(Ordering::Acquire)));
        let _stop = Stop(&done); // set on return and on unwind, so the scope's wait for the keepers ends
        f()
    })
}

/// One keeper: on a worker not already inside a keeper, a [`keep_round`], then, if the round ended on idleness (not
/// on the forward's end or a second forward), itself again as a new job of the scope, queued on this worker (so a
/// frame below, if any, probes its join first). Taken by the forward's own thread or run from inside another keeper,
/// it returns at once and that keeper is gone (its worker may sleep again, as without keepers): passing it on there
/// would put it on top of the queue the frames below are waiting to pop.
fn keep<'s>(s: &rayon::Scope<'s>, done: &'s AtomicBool, owner: usize) {
    KEEPER_CALLS.with(|c| c.set(c.get().wrapping_add(1)));
    if rayon::current_thread_index() == Some(owner) || IN_KEEPER.with(Cell::get) {
        return;
    }
    IN_KEEPER.with(|k| k.set(true));
    let go_on = {
        let _out = OutOfKeeper;
        keep_round(done)
    };
    if go_on {
        s.spawn(move |s| keep(s, done, owner));
    }
}

thread_local! {
    /// Whether this thread is inside a [`keep_round`] (a keeper it runs from there returns at once).
    static IN_KEEPER: Cell<bool> = const { Cell::new(false) };
    /// Keeper calls on this thread, so a round can tell a look that ran a keeper (idle) from one that ran work.
    static KEEPER_CALLS: Cell<u64> = const { Cell::new(0) };
}

/// Clears [`IN_KEEPER`] when a round ends (return or unwind).
struct OutOfKeeper;

impl Drop for OutOfKeeper {
    fn drop(&mut self) {
        IN_KEEPER.with(|k| k.set(false));
    }
}

/// Idle looks for work in a row (finding none, or running a job during which a keeper ran) after which a keeper
/// returns and queues itself again (about 20 µs at ~80 ns a look).
const IDLE_ROUNDS: u32 = 256;

/// Steals and runs pool work until the forward is done, another forward starts, or [`IDLE_ROUNDS`] looks in a row
/// find none; true for the last (the keeper goes on), false when it is over (or off the pool).
fn keep_round(done: &AtomicBool) -> bool {
    let mut idle = 0;
    while !done.load(Ordering::Acquire) && RUNNING.load(Ordering::Acquire) == 1 {
        let calls = KEEPER_CALLS.with(Cell::get);
        let worked = match rayon::yield_now() {
            Some(rayon::Yield::Executed) => KEEPER_CALLS.with(Cell::get) == calls,
            Some(rayon::Yield::Idle) => false,
            None => return false,
        };
        if worked {
            idle = 0;
            continue;
        }
        idle += 1;
        if idle == IDLE_ROUNDS {
            return true;
        }
        std::hint::spin_loop();
    }
    false
}

/// Whether a pool of `threads` may spin: not past the host's cores, where a spinning worker would take a core from
/// one with work.
fn spinning_fits(threads: usize) -> bool {
    static CORES: OnceLock<usize> = OnceLock::new();
    let cores = *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    threads > 1 && threads <= cores
}

/// Counts a forward in [`RUNNING`] for its lifetime (unwinding included).
struct Running;

impl Running {
    fn enter() -> Self {
        RUNNING.fetch_add(1, Ordering::AcqRel);
        Running
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        RUNNING.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Held by the tests that run kept scopes, so each runs alone and its keepers really spin (a second forward stops
/// them, which would hide a keeper that never stops).
#[cfg(test)]
pub(super) static TESTS_ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Marks the forward done when dropped.
struct Stop<'a>(&'a AtomicBool);

impl Drop for Stop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::{TESTS_ONE_AT_A_TIME, kept_scope};
    use rayon::prelude::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::mpsc;
    use std::time::Duration;

    /// A pool of `threads` workers (the tests' own: the global pool's size is the host's).
    fn pool(threads: usize) -> rayon::ThreadPool {
        rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("a test pool")
    }

    /// Runs `f` on another thread and fails if it has not returned in 60 s (a keeper that never stops hangs).
    fn within_a_minute<R: Send + 'static>(f: impl FnOnce() -> R + Send + 'static) -> R {
        let _alone = TESTS_ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || tx.send(f()));
        rx.recv_timeout(Duration::from_secs(60)).expect("returned within a minute (no hang, no panic)")
    }

    /// Forks inside a kept scope give what they give outside it, and every scope returns: its keepers stop when the
    /// forward ends (a join whose second half a keeper steals while the first sleeps puts the forward's own thread
    /// in a wait for work, where it meets its copy of the broadcast, and the keeper's respawns meet the scope's end).
    #[test]
    fn kept_scopes_return_their_forks_results() {
        let forks = || {
            let nap = || std::thread::sleep(Duration::from_millis(2));
            let (a, b) = rayon::join(|| (nap(), 1u64).1, || (nap(), 2u64).1);
            let sums = (0..64u64).map(|i| (0..1000u64).into_par_iter().map(|v| v * i).sum::<u64>());
            std::iter::once(a + b).chain(sums).collect::<Vec<u64>>()
        };
        let (on_a_worker, from_outside) = within_a_minute(move || {
            let p = pool(2);
            ((0..20).map(|_| p.install(|| kept_scope(forks))).collect::<Vec<_>>(), kept_scope(forks))
        });
        let want: Vec<u64> = std::iter::once(3).chain((0..64).map(|i| (0..1000u64).map(|v| v * i).sum())).collect();
        assert!(on_a_worker.iter().all(|r| *r == want));
        assert_eq!(from_outside, want, "called off the pool (the global pool's scope)");
    }

    /// Runs a keeper inside a join's first half on a pool of `threads`, as on a worker that took it while waiting
    /// inside a fork, after queuing `queued` more keepers on that worker, with `done` set only after the join (a
    /// forward sets it only after its forks). Returns when the join does; [`within_a_minute`] fails the test if a
    /// keeper never lets the join go on.
    fn keeper_above_a_join(threads: usize, queued: usize) {
        within_a_minute(move || {
            pool(threads).install(|| {
                let _running = super::Running::enter();
                let done = AtomicBool::new(false);
                rayon::scope(|s| {
                    let keepers = || {
                        (0..queued).for_each(|_| s.spawn(|s| super::keep(s, &done, usize::MAX)));
                        super::keep(s, &done, usize::MAX)
                    };
                    rayon::join(keepers, || std::thread::sleep(Duration::from_millis(1)));
                    done.store(true, Ordering::Release);
                });
            })
        })
    }

    /// A keeper above a fork returns after its idle rounds, so the fork below it goes on; a keeper that spun until
    /// `done` would wait on that fork for ever.
    #[test]
    fn a_keeper_above_a_fork_that_must_go_on_returns() {
        keeper_above_a_join(2, 0);
    }

    /// A keeper above a fork still returns while another keeper waits in the same queue (the second review's case:
    /// a keeper that ran a queued keeper as work, and that one passing itself on, would never count its idle looks).
    /// One worker, so the queue is this thread's alone.
    #[test]
    fn a_keeper_with_another_in_its_queue_returns() {
        keeper_above_a_join(1, 1);
    }

    /// A panic inside a kept scope reaches the caller after the keepers stop, and the next scope on the same pool
    /// runs normally.
    #[test]
    fn a_panic_in_a_kept_scope_propagates_and_leaves_the_pool_usable() {
        let (first, second) = within_a_minute(|| {
            let p = pool(2);
            let first = p.install(|| {
                std::panic::catch_unwind(|| kept_scope(|| (0..64).into_par_iter().for_each(|i| assert!(i < 63))))
            });
            let second = p.install(|| kept_scope(|| (0..64u32).into_par_iter().sum::<u32>()));
            (first.is_err(), second)
        });
        assert!(first, "the panic propagated");
        assert_eq!(second, 2016);
    }

    /// Forwards started from several threads at once on one pool (as concurrent tests do) all finish: keepers stop
    /// when a second forward starts, so no two forwards wait on each other.
    #[test]
    fn concurrent_kept_scopes_all_finish() {
        let total = within_a_minute(|| {
            let p = std::sync::Arc::new(pool(2));
            let runs: Vec<_> = (0..4u64)
                .map(|t| {
                    let p = p.clone();
                    std::thread::spawn(move || {
                        (0..50u64)
                            .map(|r| {
                                p.install(|| {
                                    kept_scope(|| (0..500u64).into_par_iter().map(|v| v ^ (t + r)).sum::<u64>())
                                })
                            })
                            .sum::<u64>()
                    })
                })
                .collect();
            runs.into_iter().map(|h| h.join().expect("a forward thread")).sum::<u64>()
        });
        let want: u64 =
            (0..4u64).flat_map(|t| (0..50u64).map(move |r| (0..500u64).map(|v| v ^ (t + r)).sum::<u64>())).sum();
        assert_eq!(total, want);
    }
}
