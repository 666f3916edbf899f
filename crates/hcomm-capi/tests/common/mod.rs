//! Helpers of the C tests: build the library and `hcommrun`, compile C programs against them
//! with gcc, run jobs with a time limit.
//!
//! Cargo builds a package's `cdylib` for `cargo build` but not for its tests, so the first
//! helper that needs the library runs `cargo build` for this test's profile and target
//! directory (found from this test executable's path, `target/<profile>/deps/<test>`): the C
//! programs always link the library of the current sources, and nothing is rebuilt when it is
//! current.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The workspace root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The profile directory of this build, `target/<profile>`, with `libhcomm.so`, `libhcomm.a`
/// and `hcommrun` built from the current sources.
pub fn profile_dir() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let exe = std::env::current_exe().expect("test executable path");
            let dir = exe
                .parent()
                .and_then(Path::parent)
                .expect("the test runs from target/<profile>/deps");
            let mut cargo =
                Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
            cargo
                .current_dir(root())
                .args(["build", "-p", "hcomm-capi", "-p", "hcomm-tools"])
                .args(["--lib", "--bin", "hcommrun", "--target-dir"])
                .arg(dir.parent().expect("target directory"));
            match dir.file_name().and_then(|n| n.to_str()) {
                Some("debug") => {}
                Some("release") => {
                    cargo.arg("--release");
                }
                Some(profile) => {
                    cargo.args(["--profile", profile]);
                }
                None => panic!("no profile in {}", dir.display()),
            }
            let status = cargo.status().expect("running cargo build");
            assert!(
                status.success(),
                "cargo build of libhcomm and hcommrun failed"
            );
            dir.to_path_buf()
        })
        .clone()
}

/// `hcommrun` of this build.
pub fn hcommrun() -> PathBuf {
    profile_dir().join("hcommrun")
}

/// A directory removed when dropped.
pub struct TempDir(PathBuf);

impl TempDir {
    /// A fresh directory named after `name`.
    pub fn new(name: &str) -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "hcomm-capi-{name}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("creating a temporary directory");
        TempDir(dir)
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Compiles `source` (relative to the workspace root) into `dir/name` against this build's
/// `libhcomm.so` with warnings as errors; the program finds the library through its rpath
/// (`dir` holds the `libhcomm.so.0` link its soname asks for).
pub fn compile(dir: &TempDir, name: &str, source: &str) -> PathBuf {
    compile_with(dir, name, &[source], &[])
}

/// Like [`compile`], for a program of several `sources` built with the gcc options `extra`
/// (`-DNAME=value`).
pub fn compile_with(dir: &TempDir, name: &str, sources: &[&str], extra: &[&str]) -> PathBuf {
    let lib = profile_dir();
    let link = dir.path().join("libhcomm.so.0");
    if !link.exists() {
        std::os::unix::fs::symlink(lib.join("libhcomm.so"), &link).expect("libhcomm.so.0 link");
    }
    let out = dir.path().join(name);
    let root = root();
    let mut gcc = Command::new("gcc");
    gcc.args(["-std=c11", "-O1", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(root.join("crates/hcomm-capi/include"))
        .arg("-I")
        .arg(root.join("crates/hcomm-capi/tests/c"))
        .args(extra)
        .args(sources.iter().map(|s| root.join(s)))
        .arg("-o")
        .arg(&out)
        .arg("-L")
        .arg(&lib)
        .arg(format!("-Wl,-rpath,{}", dir.path().display()))
        .args(["-lhcomm", "-lm"]);
    succeeds(&mut gcc);
    out
}

/// Runs a compiler or build command; fails the test with its output unless it succeeds.
pub fn succeeds(cmd: &mut Command) {
    let output = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?} (is it installed?): {e}"));
    assert!(
        output.status.success(),
        "{cmd:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// What a finished job printed.
pub struct Finished {
    pub success: bool,
    pub stdout: String,
    pub stderr: String,
}

impl Finished {
    /// Fails the test, showing the output, unless the job succeeded.
    pub fn assert_success(&self, what: &str) -> &Self {
        assert!(
            self.success,
            "{what} failed\nstdout:\n{}\nstderr:\n{}",
            self.stdout, self.stderr
        );
        self
    }

    /// Fails the test unless stdout holds `text`.
    pub fn assert_stdout_has(&self, text: &str) -> &Self {
        assert!(
            self.stdout.contains(text),
            "no {text:?} in stdout:\n{}\nstderr:\n{}",
            self.stdout,
            self.stderr
        );
        self
    }
}

/// A started process whose stdout and stderr go to files.
pub struct Running {
    child: std::process::Child,
    command: String,
    out: PathBuf,
    err: PathBuf,
}

/// Starts `cmd` in `dir` without the launcher variables of an outer job (those set on `cmd`
/// stay); `name` names its output files there.
pub fn start(dir: &TempDir, cmd: &mut Command, name: &str) -> Running {
    hcomm_testkit::without_launcher_env(cmd);
    let out = dir.path().join(format!("{name}.stdout"));
    let err = dir.path().join(format!("{name}.stderr"));
    let child = cmd
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).expect("stdout file"))
        .stderr(std::fs::File::create(&err).expect("stderr file"))
        .spawn()
        .expect("starting the program");
    Running {
        child,
        command: format!("{cmd:?}"),
        out,
        err,
    }
}

impl Running {
    /// Waits until `deadline`, then kills the process and fails the test.
    pub fn finish(mut self, deadline: Instant) -> Finished {
        let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
        let status = loop {
            if let Some(s) = self.child.try_wait().expect("waiting for the program") {
                break s;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "{} did not finish in time\nstdout:\n{}\nstderr:\n{}",
                    self.command,
                    read(&self.out),
                    read(&self.err)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        Finished {
            success: status.success(),
            stdout: read(&self.out),
            stderr: read(&self.err),
        }
    }
}

/// Runs `cmd` in `dir`, killed after `limit`.
pub fn run(dir: &TempDir, cmd: &mut Command, limit: Duration) -> Finished {
    start(dir, cmd, "job").finish(Instant::now() + limit)
}

/// Runs `program args` on `n` ranks under hcommrun.
pub fn job(dir: &TempDir, n: usize, program: &Path, args: &[&str], limit: Duration) -> Finished {
    job_with_env(dir, n, program, args, &[], limit)
}

/// Runs `program args` on `n` ranks under hcommrun, with the variables `env` set.
pub fn job_with_env(
    dir: &TempDir,
    n: usize,
    program: &Path,
    args: &[&str],
    env: &[(&str, &str)],
    limit: Duration,
) -> Finished {
    let mut cmd = Command::new(hcommrun());
    cmd.envs(env.iter().copied())
        .arg("-n")
        .arg(n.to_string())
        .arg("--")
        .arg(program)
        .args(args);
    run(dir, &mut cmd, limit)
}
