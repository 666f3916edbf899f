//! An in-process fuzzer for the decoders of bytes that come from outside the process (test
//! builds only).
//!
//! cargo-fuzz needs a nightly toolchain; these harnesses run on stable, inside the test suite.
//! Each target is a unit test named `fuzz_*` next to its decoder: it hands [`run`]'s inputs to
//! the decoder and checks its properties (no panic, memory bounded by what arrived rather
//! than by what a length field claims, malformed input rejected with an error, valid encodings
//! round-tripping). An input is either random bytes or a valid encoding of the target (its
//! seeds) after a few mutations: bit flips, interesting integers (the target's limits, give or
//! take one) planted at random offsets, insertions, deletions, truncations and splices.
//!
//! The default is a short run for CI (`default_cases` of each target, a second or two).
//! `HCOMM_FUZZ_CASES=N` runs N inputs per target, `HCOMM_FUZZ_SEED=S` starts elsewhere:
//!
//! ```text
//! HCOMM_FUZZ_CASES=10000000 cargo test -p hcomm --release --lib fuzz_ -- --nocapture
//! ```
//!
//! A failing input is reported with its case seed and in hex, for a regression test that
//! calls the target's check on it.
//!
//! The allocator of the test build counts every thread's allocations, so that a harness can
//! bound what a decoder allocates ([`measure`]).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::panic::{self, AssertUnwindSafe};
use std::time::Instant;

/// Environment variable: inputs per target (default: each target's short CI run).
pub(crate) const CASES_VAR: &str = "HCOMM_FUZZ_CASES";
/// Environment variable: the seed every target starts from.
pub(crate) const SEED_VAR: &str = "HCOMM_FUZZ_SEED";
const DEFAULT_SEED: u64 = 0x4843_4f4d_4d46_5a5a;

pub(crate) use crate::rng::Rng;

/// What a target's inputs look like.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    /// Name in reports.
    pub(crate) name: &'static str,
    /// Inputs in the default (CI) run.
    pub(crate) default_cases: u64,
    /// Valid encodings to mutate.
    pub(crate) seeds: Vec<Vec<u8>>,
    /// Longest input.
    pub(crate) max_len: usize,
    /// Integers worth planting in inputs: the decoder's limits and magic numbers.
    pub(crate) dict: Vec<u64>,
}

/// Integers every target gets planted besides its own.
const INTERESTING: [u64; 12] = [
    0,
    1,
    2,
    0x7f,
    0x80,
    0xff,
    0xffff,
    0x7fff_ffff,
    0xffff_ffff,
    1 << 32,
    i64::MAX as u64,
    u64::MAX,
];

impl Target {
    /// Makes the input of one case in `out`.
    fn generate(&self, rng: &mut Rng, out: &mut Vec<u8>) {
        out.clear();
        if self.seeds.is_empty() || rng.one_in(8) {
            out.resize(rng.len(self.max_len), 0);
            rng.fill(out);
            return;
        }
        let seed: &Vec<u8> = rng.pick(&self.seeds);
        out.extend_from_slice(seed);
        let most = 1 << rng.below(4);
        let mutations = 1 + rng.below(most);
        for _ in 0..mutations {
            self.mutate(rng, out);
        }
        out.truncate(self.max_len);
    }

    fn mutate(&self, rng: &mut Rng, out: &mut Vec<u8>) {
        let at = |rng: &mut Rng, out: &Vec<u8>| rng.below(out.len() + 1);
        match rng.below(9) {
            0 if !out.is_empty() => {
                let i = rng.below(out.len());
                out[i] ^= 1 << rng.below(8);
            }
            1 if !out.is_empty() => {
                let i = rng.below(out.len());
                let random = rng.next_u64() as u8;
                out[i] = *rng.pick(&[0, 1, 0x7f, 0x80, 0xff, random]);
            }
            2 => {
                let base = if self.dict.is_empty() || rng.one_in(2) {
                    *rng.pick(&INTERESTING)
                } else {
                    *rng.pick(&self.dict)
                };
                let value = base.wrapping_add(*rng.pick(&[0, 0, 1, u64::MAX]));
                let width = *rng.pick(&[1usize, 2, 4, 8]);
                if out.len() >= width {
                    let i = rng.below(out.len() - width + 1);
                    out[i..i + width].copy_from_slice(&value.to_le_bytes()[..width]);
                }
            }
            3 => {
                let i = at(rng, out);
                let mut extra = vec![0u8; 1 + rng.below(16)];
                rng.fill(&mut extra);
                out.splice(i..i, extra);
            }
            4 if !out.is_empty() => {
                let i = rng.below(out.len());
                let n = 1 + rng.below((out.len() - i).min(16));
                out.drain(i..i + n);
            }
            5 => {
                let i = at(rng, out);
                out.truncate(i);
            }
            6 => {
                let n = 1 + rng.below(32);
                let start = out.len();
                out.resize(start + n, 0);
                rng.fill(&mut out[start..]);
            }
            7 => {
                let other: &Vec<u8> = rng.pick(&self.seeds);
                let from = rng.below(other.len() + 1);
                let i = at(rng, out);
                out.truncate(i);
                out.extend_from_slice(&other[from..]);
            }
            _ if !out.is_empty() => {
                let i = rng.below(out.len());
                let n = 1 + rng.below((out.len() - i).min(64));
                let chunk = out[i..i + n].to_vec();
                let j = at(rng, out);
                out.splice(j..j, chunk);
            }
            _ => {}
        }
    }
}

fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    let v = v.trim().replace('_', "");
    match v.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => v.parse().ok(),
    }
}

/// Runs `check` on the inputs of `target`: its default number or `HCOMM_FUZZ_CASES`. `check`
/// gets the input and a generator seeded for the case, for the choices a harness makes
/// besides the input (how a stream splits its reads, say). A panic in `check` fails the test
/// with the case's seed and input, for a regression test; the number of cases and the time
/// they took are printed at the end (`--nocapture` shows them).
pub(crate) fn run(target: &Target, mut check: impl FnMut(&[u8], &mut Rng)) {
    let cases = env_u64(CASES_VAR).unwrap_or(target.default_cases);
    let seed = env_u64(SEED_VAR).unwrap_or(DEFAULT_SEED);
    let start = Instant::now();
    let mut input = Vec::with_capacity(target.max_len);
    for case in 0..cases {
        let case_seed = seed ^ case.wrapping_mul(0xd134_2543_de82_ef95);
        let mut rng = Rng::new(case_seed);
        target.generate(&mut rng, &mut input);
        let outcome = panic::catch_unwind(AssertUnwindSafe(|| check(&input, &mut rng)));
        if let Err(payload) = outcome {
            let why = payload
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| payload.downcast_ref::<&str>().copied())
                .unwrap_or("a panic");
            panic!(
                "fuzz target {} failed on case {case} ({SEED_VAR}={seed:#x}, case seed \
                 {case_seed:#x}): {why}\ninput ({} bytes): {}",
                target.name,
                input.len(),
                hex::encode(&input)
            );
        }
    }
    let took = start.elapsed();
    println!(
        "fuzz {}: {cases} cases in {took:.2?} ({:.0} per second), {SEED_VAR}={seed:#x}",
        target.name,
        cases as f64 / took.as_secs_f64().max(1e-9)
    );
}

/// What a closure allocated on its thread (see [`measure`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Usage {
    /// Most bytes it held allocated at once.
    pub(crate) peak: usize,
    /// Its largest single allocation.
    pub(crate) largest: usize,
}

thread_local! {
    /// Bytes this thread allocated and has not freed (negative when it frees what other
    /// threads allocated).
    static LIVE: Cell<isize> = const { Cell::new(0) };
    /// Highest `LIVE` since the last reset.
    static PEAK: Cell<isize> = const { Cell::new(0) };
    /// Largest single allocation since the last reset.
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

/// Runs `f` and reports what it allocated on this thread.
pub(crate) fn measure<T>(f: impl FnOnce() -> T) -> (T, Usage) {
    let base = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(base));
    LARGEST.with(|l| l.set(0));
    let out = f();
    let peak = PEAK.with(Cell::get).saturating_sub(base).max(0) as usize;
    let usage = Usage {
        peak,
        largest: LARGEST.with(Cell::get),
    };
    (out, usage)
}

/// The test build's allocator: the system's, counting each thread's allocations.
struct Counting;

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn allocated(size: usize) {
    // `try_with`: nothing to count once the thread's locals are gone.
    let _ = LIVE.try_with(|live| {
        let now = live.get().saturating_add(size as isize);
        live.set(now);
        let _ = PEAK.try_with(|p| p.set(p.get().max(now)));
    });
    let _ = LARGEST.try_with(|l| l.set(l.get().max(size)));
}

fn freed(size: usize) {
    let _ = LIVE.try_with(|live| live.set(live.get().saturating_sub(size as isize)));
}

// SAFETY: every call is passed on unchanged to the system allocator, which upholds the
// contract; the counting only touches thread-locals that need no allocation.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        allocated(layout.size());
        // SAFETY: the caller's guarantees for `layout` are the system allocator's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        allocated(layout.size());
        // SAFETY: as in `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        freed(layout.size());
        // SAFETY: `ptr` came from this allocator, hence from the system's, with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        freed(layout.size());
        allocated(new_size);
        // SAFETY: as in `dealloc`; `new_size` is the caller's to guarantee.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measure_counts_this_threads_allocations() {
        let (v, usage) = measure(|| {
            let a = vec![0u8; 1000];
            drop(a);
            vec![0u8; 300]
        });
        assert_eq!(v.len(), 300);
        assert_eq!(usage.largest, 1000);
        assert!(usage.peak >= 1000 && usage.peak < 1300, "{usage:?}");
        let ((), none) = measure(|| ());
        assert_eq!(
            none,
            Usage {
                peak: 0,
                largest: 0
            }
        );
    }

    #[test]
    fn inputs_are_reproducible_and_bounded() {
        let target = Target {
            name: "self-test",
            default_cases: 0,
            seeds: vec![b"hello, world".to_vec(), vec![0; 40]],
            max_len: 64,
            dict: vec![12345],
        };
        let make = |seed| {
            let mut rng = Rng::new(seed);
            let mut out = Vec::new();
            target.generate(&mut rng, &mut out);
            out
        };
        for seed in 0..2000 {
            let a = make(seed);
            assert!(a.len() <= 64);
            assert_eq!(a, make(seed));
        }
        assert_ne!(make(1), make(2));
    }
}
