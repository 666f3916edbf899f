//! The cheap clock of the statistics: the time-stamp counter where the CPU has one that all
//! cores and processes share, otherwise nanoseconds of the monotonic clock.
//!
//! Reading the TSC costs about 8 ns here against 20 ns for `Instant::now`; the profiler
//! converts ticks to time with the two readings [`ticks`] and [`monotonic_ns`] that the
//! statistics segment records at its creation.
//!
//! The flight recorder's clock is coarser and cheaper still: a word of
//! `CLOCK_MONOTONIC_COARSE` nanoseconds that the threads already reading the clock refresh
//! ([`now`], [`pausing`]).

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

/// What [`ticks`] counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum TickKind {
    /// The x86-64 time-stamp counter (invariant: the same rate on every core).
    Tsc = 1,
    /// Nanoseconds of `CLOCK_MONOTONIC`.
    MonotonicNs = 2,
}

/// What [`ticks`] counts on this build.
pub const TICK_KIND: TickKind = if cfg!(target_arch = "x86_64") {
    TickKind::Tsc
} else {
    TickKind::MonotonicNs
};

/// A reading of the statistics clock (never 0: 0 means "not measured" in the segment).
#[inline]
pub fn ticks() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: RDTSC has no preconditions; every x86-64 CPU has it.
        unsafe { core::arch::x86_64::_rdtsc() }.max(1)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        monotonic_ns().max(1)
    }
}

/// Nanoseconds of `CLOCK_MONOTONIC`, the clock every process of the host shares.
pub fn monotonic_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    (t.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(t.tv_nsec as u64)
}

/// The flight recorder's clock word: `CLOCK_MONOTONIC_COARSE` nanoseconds as of its last
/// refresh (0: never read). Reading it is one relaxed load, where reading the clock costs
/// about 10 ns here (3% of an 8-byte all-reduce between two cores). It is refreshed by the
/// engine's watcher at every turn (every `HCOMM_TIMEOUT / 8`, 10 ms to 1 s), by every wait
/// that yields or sleeps ([`pausing`]), and by [`coarse_ns`]'s callers that store what they
/// read.
static NOW: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// When this thread's waits first yielded or slept since [`take_pause`] last asked (0:
    /// they did not).
    static PAUSED_AT: Cell<u64> = const { Cell::new(0) };
}

/// Nanoseconds of `CLOCK_MONOTONIC_COARSE`: the monotonic clock as of the kernel's last timer
/// tick (4 ms on this host's kernel), read from the vDSO's data page; never 0 (which means
/// "not yet" to its readers). Stores what it read in the clock word ([`now`]).
pub(crate) fn coarse_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::MonotonicCoarse);
    let ns = (t.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(t.tv_nsec as u64)
        .max(1);
    NOW.fetch_max(ns, Ordering::Relaxed);
    ns
}

/// The clock word: [`coarse_ns`] as of its last refresh (a relaxed load; the clock is read
/// only the first time). It may lag the clock by up to a watcher interval (1 s by default)
/// while nothing waits.
#[inline]
pub(crate) fn now() -> u64 {
    match NOW.load(Ordering::Relaxed) {
        0 => coarse_ns(),
        t => t,
    }
}

/// A wait of this thread yields or sleeps now: refreshes the clock word and notes the time
/// for [`take_pause`] (the first pause since the last take counts).
#[cold]
pub(crate) fn pausing() {
    let t = coarse_ns();
    let _ = PAUSED_AT.try_with(|p| {
        if p.get() == 0 {
            p.set(t);
        }
    });
}

/// When this thread's waits first yielded or slept since the last call (`None`: they did
/// not), and starts over.
#[inline]
pub(crate) fn take_pause() -> Option<u64> {
    PAUSED_AT
        .try_with(|p| p.replace(0))
        .ok()
        .filter(|&t| t != 0)
}
