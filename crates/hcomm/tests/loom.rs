//! The loom model checks of the crate, as part of the normal test suite.
//!
//! Loom tests only exist in a build with `--cfg loom` (they swap the shared-memory ring's
//! atomics for loom's), which a normal `cargo test` or `cargo nextest run` never makes. This
//! test makes it: it runs
//!
//! ```text
//! RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=<target>/loom \
//!     cargo test -p hcomm --profile loom --lib -- loom_tests
//! ```
//!
//! with `<target>` the workspace's target directory, so that the `--cfg loom` build has its
//! own directory (the same one as the command written in `transport::shm::ring`) and never
//! evicts the normal build. Every test in a module named `loom_tests` runs. The test fails
//! when cargo cannot be started, when the nested run fails, and when it ran no loom test
//! (a renamed module or a filter that matches nothing must not pass silently).
//!
//! Cost: the first run compiles loom, hcomm and its dependencies in the `loom` profile of the
//! workspace's Cargo.toml (unoptimised but for loom itself, without debug info: 40 s on the
//! 2-core VM, 84 s at opt-level 1); later runs reuse `<target>/loom` and take a few seconds. The nextest
//! override in `.config/nextest.toml` gives this test a longer slow-timeout and both test
//! threads. The model checks explore every interleaving by default (under a second today);
//! should they grow too slow, bound loom's search with `LOOM_MAX_PREEMPTIONS=2` (or 3) in the
//! environment: it is passed on to the nested run, as are the other `LOOM_*` settings.

// A `--cfg loom` build of the whole workspace must not run cargo from inside itself.
#![cfg(not(loom))]

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The filter that selects the loom tests: every module of them is named `loom_tests`.
const FILTER: &str = "loom_tests";

/// The cargo that builds this test: `$CARGO` at run time (set by cargo and nextest), else the
/// one that compiled this file.
fn cargo() -> OsString {
    std::env::var_os("CARGO").unwrap_or_else(|| env!("CARGO").into())
}

/// The workspace's target directory: the parent of this test's scratch directory
/// (`<target>/tmp`), which cargo places there for integration tests.
fn target_dir() -> PathBuf {
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    tmp.parent()
        .unwrap_or_else(|| panic!("no parent of CARGO_TARGET_TMPDIR {}", tmp.display()))
        .to_path_buf()
}

/// The `RUSTFLAGS` of the nested build: the caller's (e.g. `-D warnings`) plus `--cfg loom`.
fn rustflags() -> OsString {
    let mut flags = std::env::var_os("RUSTFLAGS").unwrap_or_default();
    if !flags.is_empty() {
        flags.push(" ");
    }
    flags.push("--cfg loom");
    flags
}

/// Names of the tests that passed, from libtest's output (`test NAME ... ok`).
fn passed(stdout: &str) -> Vec<&str> {
    stdout
        .lines()
        .filter_map(|l| l.strip_prefix("test ")?.strip_suffix(" ... ok"))
        .collect()
}

#[test]
fn loom_model_checks_pass() {
    let target = target_dir().join("loom");
    let cargo = cargo();
    let mut cmd = Command::new(&cargo);
    cmd.current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["test", "-p", "hcomm", "--lib", "--profile", "loom"])
        .args(["--", FILTER])
        .env("RUSTFLAGS", rustflags())
        // Would take precedence over RUSTFLAGS.
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env("CARGO_TARGET_DIR", &target);
    let out = cmd.output().unwrap_or_else(|e| {
        panic!(
            "cannot run {} for the loom tests: {e} (cargo is required; this test is never skipped)",
            Path::new(&cargo).display()
        )
    });
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Shown by the test runner when the test fails (and with --no-capture).
    println!("{cmd:?}\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}");
    assert!(
        out.status.success(),
        "the loom tests failed ({}); their output is above",
        out.status
    );
    let ran = passed(&stdout);
    assert!(
        ran.iter().any(|name| name.contains(FILTER)),
        "the nested run passed no test matching {FILTER:?}: no loom test ran"
    );
    println!("{} loom tests passed: {ran:?}", ran.len());
}

#[test]
fn passed_reads_libtest_output() {
    let out = "running 2 tests\n\
               test a::loom_tests::one ... ok\n\
               test a::loom_tests::two ... FAILED\n\
               test result: FAILED. 1 passed; 1 failed";
    assert_eq!(passed(out), ["a::loom_tests::one"]);
    assert!(passed("running 0 tests\ntest result: ok. 0 passed").is_empty());
}
