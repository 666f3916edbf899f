//! The C API from C: gcc compiles programs against the libhcomm.so of this build and runs them
//! alone and under hcommrun; `make install` into a scratch prefix lets the seed's example build
//! with exactly `gcc example.c -o example -lhcomm`.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{compile, compile_with, hcommrun, job, job_with_env, root, run, Finished, TempDir};
use hcomm_testkit::free_port;

const LIMIT: Duration = Duration::from_secs(120);

#[test]
fn seed_example_prints_the_message_on_two_ranks() {
    let dir = TempDir::new("seed");
    let example = compile(&dir, "example", "examples/c/example.c");
    job(&dir, 2, &example, &[], LIMIT)
        .assert_success("the seed example")
        .assert_stdout_has("Received: Hello from rank 0");
}

/// Runs the C test program `source` (whose name it has) on each of `ranks` under hcommrun,
/// through hcomm's own transports or, with `plugin`, the Unix-socket plug-in; checks that
/// every job succeeded (and that the plug-in carried its traffic) and returns their output.
fn suite(source: &str, ranks: &[usize], plugin: bool) -> Vec<Finished> {
    let name = Path::new(source)
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap();
    let dir = TempDir::new(name);
    let (program, env) = match plugin {
        true => (with_unix_plugin(&dir, name, source), UNIX),
        false => (compile(&dir, name, source), &[][..]),
    };
    let mut done = Vec::new();
    for &n in ranks {
        let finished = job_with_env(&dir, n, &program, &[], env, LIMIT);
        finished.assert_success(&format!("{name} on {n} ranks (plug-in: {plugin})"));
        if plugin {
            assert_plugin_carried(&finished, n);
        }
        done.push(finished);
    }
    done
}

fn collectives_on(n: usize, plugin: bool) {
    suite("crates/hcomm-capi/tests/c/collectives.c", &[n], plugin)[0]
        .assert_stdout_has("PASS collectives")
        .assert_stdout_has(&format!("calls on {n} ranks"));
}

#[test]
fn every_collective_type_and_op_matches_the_reference_on_1_rank() {
    collectives_on(1, false);
}

#[test]
fn every_collective_type_and_op_matches_the_reference_on_2_ranks() {
    collectives_on(2, false);
}

#[test]
fn every_collective_type_and_op_matches_the_reference_on_3_ranks() {
    collectives_on(3, false);
}

#[test]
fn every_collective_type_and_op_matches_the_reference_on_5_ranks() {
    collectives_on(5, false);
}

fn point_to_point_groups_and_split(plugin: bool) {
    let ranks = [1, 2, 3, 5];
    let jobs = suite("crates/hcomm-capi/tests/c/p2p_groups.c", &ranks, plugin);
    for (n, finished) in ranks.iter().zip(&jobs) {
        finished.assert_stdout_has(&format!("PASS p2p_groups on {n} ranks"));
    }
}

#[test]
fn point_to_point_groups_and_split_on_1_2_3_and_5_ranks() {
    point_to_point_groups_and_split(false);
}

/// `source` linked with the Unix-socket plug-in of `examples/c/plugin_unix.c`, which it
/// registers before `hcommInit`.
fn with_unix_plugin(dir: &TempDir, name: &str, source: &str) -> std::path::PathBuf {
    compile_with(
        dir,
        name,
        &[source, "examples/c/plugin_unix.c"],
        &[
            "-DPLUGIN_UNIX_NO_MAIN",
            "-DTEST_TRANSPORT_PLUGIN=plugin_unix_register",
        ],
    )
}

/// Selects the Unix-socket plug-in, which reports its traffic at finalize.
const UNIX: &[(&str, &str)] = &[("HCOMM_TRANSPORT", "unix"), ("HCOMM_UNIX_STATS", "1")];

/// Every rank of a job of `n` reported what the plug-in carried: something, unless alone.
fn assert_plugin_carried(job: &Finished, n: usize) {
    for r in 0..n {
        let prefix = format!("plugin_unix: rank {r} of {n}: sent ");
        let sent: u64 = job
            .stdout
            .lines()
            .find_map(|l| l.split_once(&prefix))
            .and_then(|(_, rest)| rest.split(' ').next()?.parse().ok())
            .unwrap_or_else(|| panic!("no {prefix:?} in stdout:\n{}", job.stdout));
        assert_eq!(
            sent > 0,
            n > 1,
            "rank {r} sent {sent} messages through the plug-in"
        );
    }
}

#[test]
fn every_collective_matches_the_reference_through_the_unix_socket_plugin_on_1_rank() {
    collectives_on(1, true);
}

#[test]
fn every_collective_matches_the_reference_through_the_unix_socket_plugin_on_2_ranks() {
    collectives_on(2, true);
}

#[test]
fn every_collective_matches_the_reference_through_the_unix_socket_plugin_on_3_ranks() {
    collectives_on(3, true);
}

#[test]
fn every_collective_matches_the_reference_through_the_unix_socket_plugin_on_5_ranks() {
    collectives_on(5, true);
}

#[test]
fn point_to_point_groups_and_split_through_the_unix_socket_plugin_on_1_2_3_and_5_ranks() {
    point_to_point_groups_and_split(true);
}

#[test]
fn the_plugin_example_runs_and_an_unknown_transport_is_refused() {
    let dir = TempDir::new("plugin-example");
    let program = compile(&dir, "plugin_unix", "examples/c/plugin_unix.c");
    let finished = job_with_env(&dir, 3, &program, &[], UNIX, LIMIT);
    finished
        .assert_success("plugin_unix.c")
        .assert_stdout_has("rank 1 of 3: got \"hello from rank 0\"; the ranks sum to 3");
    assert_plugin_carried(&finished, 3);
    let refused = job_with_env(
        &dir,
        2,
        &program,
        &[],
        &[("HCOMM_TRANSPORT", "pigeon")],
        LIMIT,
    );
    assert!(!refused.success, "{}", refused.stdout);
    for text in ["invalid argument", "\"pigeon\"", "tcp, shm, ofi, unix"] {
        assert!(
            refused.stderr.contains(text) || refused.stdout.contains(text),
            "no {text} in:\n{}",
            refused.stderr
        );
    }
}

/// validation.c alone (`ranks == 1`, no launcher) or under hcommrun.
fn validation(ranks: usize) {
    let dir = TempDir::new("validation");
    let program = compile(&dir, "validation", "crates/hcomm-capi/tests/c/validation.c");
    let mut cmd = if ranks == 1 {
        Command::new(&program)
    } else {
        let mut c = Command::new(common::hcommrun());
        c.args(["-n", &ranks.to_string(), "--"]).arg(&program);
        c
    };
    cmd.arg(ranks.to_string()).env("HCOMM_TIMEOUT", "2");
    let finished = run(&dir, &mut cmd, LIMIT);
    finished
        .assert_success("validation.c")
        .assert_stdout_has(&format!("PASS validation on rank 0 of {ranks}"));
    // hcommFree returns nothing: a foreign pointer is reported on stderr.
    assert!(
        finished
            .stderr
            .contains("hcommFree: hcomm invalid argument: 0x"),
        "{}",
        finished.stderr
    );
}

#[test]
fn bad_arguments_give_the_documented_codes_without_a_launcher() {
    validation(1);
}

#[test]
fn bad_arguments_mismatches_and_lost_peers_give_the_documented_codes_on_2_ranks() {
    validation(2);
}

#[test]
fn gradient_averaging_example_converges_and_ranks_agree() {
    let dir = TempDir::new("gradients");
    let program = gradients(&dir);
    job(&dir, 3, &program, &[], LIMIT)
        .assert_success("gradient_averaging.c")
        .assert_stdout_has("3 ranks, 768 samples")
        .assert_stdout_has("ranks agree");
}

#[test]
fn the_header_is_strict_c99() {
    let dir = TempDir::new("header");
    let source = dir.path().join("only_header.c");
    std::fs::write(
        &source,
        "#include <hcomm/hcomm.h>\nint main(void) { return hcommGetLastError(); }\n",
    )
    .unwrap();
    common::succeeds(
        Command::new("gcc")
            .args([
                "-std=c99",
                "-pedantic-errors",
                "-Wall",
                "-Wextra",
                "-Werror",
                "-c",
                "-I",
            ])
            .arg(root().join("crates/hcomm-capi/include"))
            .arg(&source)
            .arg("-o")
            .arg(dir.path().join("only_header.o")),
    );
}

/// `make install-bin install-capi` of this build into `prefix`.
fn make_install(prefix: &Path) {
    common::succeeds(
        Command::new("make")
            .current_dir(root())
            .arg("install")
            .arg(format!("PREFIX={}", prefix.display()))
            .arg(format!("RELEASE_DIR={}", common::profile_dir().display()))
            .env_remove("DESTDIR"),
    );
}

#[test]
fn make_install_lets_plain_gcc_build_the_seed_example() {
    let dir = TempDir::new("install");
    let prefix = dir.path().join("prefix");
    make_install(&prefix);
    let lib = prefix.join("lib");
    for f in [
        "libhcomm.so",
        "libhcomm.so.0",
        "libhcomm.a",
        "pkgconfig/hcomm.pc",
    ] {
        assert!(lib.join(f).exists(), "{f} was not installed");
    }
    assert!(prefix.join("include/hcomm/hcomm.h").is_file());
    let work = dir.path().join("work");
    std::fs::create_dir(&work).unwrap();
    std::fs::copy(root().join("examples/c/example.c"), work.join("example.c")).unwrap();
    // The article's command, verbatim; the compiler finds the scratch prefix through the
    // environment as it would find /usr/local by default.
    let gcc = |args: &[&str]| {
        common::succeeds(
            Command::new("gcc")
                .current_dir(&work)
                .args(args)
                .env("CPATH", prefix.join("include"))
                .env("LIBRARY_PATH", &lib),
        )
    };
    gcc(&["example.c", "-o", "example", "-lhcomm"]);
    let pkg = |args: &[&str]| {
        let output = Command::new("pkg-config")
            .args(args)
            .arg("hcomm")
            .env("PKG_CONFIG_PATH", lib.join("pkgconfig"))
            .output()
            .expect("running pkg-config (apt-get install pkg-config)");
        assert!(output.status.success(), "pkg-config {args:?} failed");
        String::from_utf8(output.stdout).unwrap()
    };
    let flags = pkg(&["--cflags", "--libs"]);
    assert!(flags.contains("-lhcomm"), "{flags}");
    let mut args: Vec<&str> = vec!["example.c", "-o", "example_pc"];
    args.extend(flags.split_whitespace());
    gcc(&args);
    // Static: the archive and the libraries pkg-config lists for it.
    let private = pkg(&["--static", "--libs-only-l"]);
    let archive = lib.join("libhcomm.a");
    let mut args: Vec<&str> = vec![
        "example.c",
        "-o",
        "example_static",
        archive.to_str().unwrap(),
    ];
    args.extend(private.split_whitespace().filter(|a| *a != "-lhcomm"));
    gcc(&args);
    let run_dir = TempDir::new("install-run");
    for program in ["example", "example_pc", "example_static"] {
        let mut cmd = Command::new(prefix.join("bin/hcommrun"));
        cmd.args(["-n", "2", "--"])
            .arg(work.join(program))
            .env("LD_LIBRARY_PATH", &lib);
        run(&run_dir, &mut cmd, LIMIT)
            .assert_success(program)
            .assert_stdout_has("Received: Hello from rank 0");
    }
}

/// The gradient-averaging example, compiled once per test.
fn gradients(dir: &TempDir) -> std::path::PathBuf {
    compile(dir, "gradients", "examples/c/gradient_averaging.c")
}

#[test]
fn hcomm_init_joins_jobs_of_open_mpi_and_mpich() {
    let dir = TempDir::new("mpi");
    let program = gradients(&dir);
    let root_addr = format!("127.0.0.1:{}", free_port());
    let mut ompi = Command::new("mpirun.openmpi");
    ompi.args(["--allow-run-as-root", "--oversubscribe", "-n", "3"])
        .args(["-x", &format!("HCOMM_ROOT_ADDR={root_addr}")])
        .args(["-x", "HCOMM_JOB_SECRET=capi-ompi"])
        .arg(&program)
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
    run(&dir, &mut ompi, LIMIT)
        .assert_success("the example under mpirun.openmpi")
        .assert_stdout_has("3 ranks, 768 samples")
        .assert_stdout_has("ranks agree");
    let root_addr = format!("127.0.0.1:{}", free_port());
    let mut mpich = Command::new("mpiexec.mpich");
    mpich
        .args(["-n", "3", "-genv", "HCOMM_ROOT_ADDR", &root_addr])
        .args(["-genv", "HCOMM_JOB_SECRET", "capi-mpich"])
        .arg(&program);
    run(&dir, &mut mpich, LIMIT)
        .assert_success("the example under mpiexec.mpich")
        .assert_stdout_has("3 ranks, 768 samples")
        .assert_stdout_has("ranks agree");
}

/// Starts `n` ranks of `program` by hand, each with the variables `set_env` gives it, as
/// `name` would; every rank must succeed.
fn by_hand(
    dir: &TempDir,
    program: &Path,
    name: &str,
    n: usize,
    set_env: impl Fn(&mut Command, usize),
) {
    let deadline = std::time::Instant::now() + LIMIT;
    let ranks: Vec<_> = (0..n)
        .map(|r| {
            let mut c = Command::new(program);
            set_env(&mut c, r);
            common::start(dir, &mut c, &format!("{name}-{r}"))
        })
        .collect();
    let done: Vec<Finished> = ranks.into_iter().map(|r| r.finish(deadline)).collect();
    for (r, f) in done.iter().enumerate() {
        f.assert_success(&format!("rank {r} under {name} variables"));
    }
    done[0]
        .assert_stdout_has(&format!("{n} ranks, {} samples", 256 * n))
        .assert_stdout_has("ranks agree");
}

#[test]
fn hcomm_init_joins_jobs_of_slurm_and_torchrun() {
    let dir = TempDir::new("slurm-torchrun");
    let program = gradients(&dir);
    let n = 3;
    let store = free_port();
    by_hand(&dir, &program, "slurm", n, |c, r| {
        c.env("SLURM_PROCID", r.to_string())
            .env("SLURM_NTASKS", n.to_string())
            .env("SLURM_LOCALID", r.to_string())
            .env("HCOMM_ROOT_ADDR", format!("127.0.0.1:{store}"))
            .env("HCOMM_JOB_SECRET", "capi-slurm");
    });
    // hcomm's store takes MASTER_PORT + 1 (torchrun's own store holds MASTER_PORT).
    let store = free_port();
    by_hand(&dir, &program, "torchrun", n, |c, r| {
        c.env("RANK", r.to_string())
            .env("WORLD_SIZE", n.to_string())
            .env("LOCAL_RANK", r.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", (store - 1).to_string())
            .env("HCOMM_JOB_SECRET", "capi-torchrun");
    });
}

#[test]
fn comm_abort_fails_every_waiting_rank_with_aborted_and_hcommrun_names_the_aborter() {
    let dir = TempDir::new("abort");
    let program = compile(&dir, "abort", "crates/hcomm-capi/tests/c/abort.c");
    let dumps = dir.path().join("dumps");
    let dumps_dir = dumps.display().to_string();
    let env = [
        ("HCOMM_TIMEOUT", "60"),
        ("HCOMM_TRACE_DIR", dumps_dir.as_str()),
    ];
    let started = std::time::Instant::now();
    let finished = job_with_env(&dir, 4, &program, &[], &env, LIMIT);
    let took = started.elapsed();
    let all = format!("{}{}", finished.stdout, finished.stderr);
    assert!(!finished.success, "{all}");
    assert!(all.contains("rank 3 exited with status 3"), "{all}");
    for r in 0..3 {
        let line = finished
            .stdout
            .lines()
            .find(|l| l.starts_with(&format!("[{r}] PASS abort on rank {r}:")))
            .unwrap_or_else(|| panic!("rank {r} did not pass:\n{all}"));
        println!("{line}");
        assert!(line.contains("world rank 3 aborted"), "{line}");
        let ms: f64 = line
            .split("after ")
            .nth(1)
            .and_then(|s| s.split(' ').next())
            .and_then(|s| s.parse().ok())
            .unwrap();
        // The waits began about 300 ms before the abort: anything near HCOMM_TIMEOUT fails.
        assert!(ms < 5000.0, "rank {r} waited {ms} ms:\n{all}");
    }
    assert!(took < Duration::from_secs(30), "took {took:?}:\n{all}");
    // The aborter's dump, last written by hcommCommDumpTrace.
    let dump = std::fs::read_to_string(dumps.join("rank3.json")).unwrap_or_default();
    assert!(dump.contains("\"reason\": \"api\""), "{dump}\n{all}");
}

/// `program` on 4 ranks under `hcommrun --keep-going`.
fn keep_going(program: &Path) -> Command {
    let mut cmd = Command::new(hcommrun());
    cmd.env("HCOMM_TIMEOUT", "60")
        .args(["-n", "4", "--keep-going", "--"])
        .arg(program);
    cmd
}

#[test]
fn a_rank_that_dies_is_revoked_agreed_and_shrunk_out_under_keep_going() {
    let dir = TempDir::new("ft");
    let program = compile(&dir, "ft", "crates/hcomm-capi/tests/c/ft.c");
    let finished = run(&dir, &mut keep_going(&program), LIMIT);
    let all = format!("{}{}", finished.stdout, finished.stderr);
    assert!(
        all.contains("rank 3 exited with status 9; the others go on (--keep-going)"),
        "{all}"
    );
    for r in 0..3 {
        assert!(
            finished
                .stdout
                .contains(&format!("[{r}] PASS ft on rank {r}:")),
            "rank {r} did not pass:\n{all}"
        );
    }
    // hcommrun exits with the first failure's status once every rank has exited.
    assert!(!finished.success, "{all}");
}

#[test]
fn a_shrunk_communicator_grows_by_a_process_that_joins_with_a_token_under_keep_going() {
    let dir = TempDir::new("grow");
    let program = compile(&dir, "grow", "crates/hcomm-capi/tests/c/grow.c");
    let members = common::start(&dir, &mut keep_going(&program), "members");
    // Alone: no launcher (start removes its variables) and no job secret.
    let mut alone = Command::new(&program);
    alone
        .arg("join")
        .env("HCOMM_TIMEOUT", "60")
        .env_remove("HCOMM_JOB_SECRET");
    let joiner = common::start(&dir, &mut alone, "joiner");
    let deadline = std::time::Instant::now() + LIMIT;
    let members = members.finish(deadline);
    let joiner = joiner.finish(deadline);
    let all = format!(
        "{}{}\njoiner:\n{}{}",
        members.stdout, members.stderr, joiner.stdout, joiner.stderr
    );
    for r in 0..3 {
        assert!(
            members.stdout.contains(&format!(
                "[{r}] PASS grow on rank {r}: shrunk to 3, grown to 4"
            )),
            "rank {r} did not pass:\n{all}"
        );
    }
    assert!(joiner.success, "{all}");
    assert!(
        joiner.stdout.contains("PASS grow: joined as rank 3 of 4"),
        "{all}"
    );
}

/// The C soak (random collectives and messages across 4 KiB and 1 MiB, pool and heap
/// buffers, checked against the reference) on 1 and 3 ranks; `between_hosts_through_libfabric`
/// runs it between hosts through libfabric.
#[test]
fn the_c_soak_matches_the_reference_on_1_and_3_ranks() {
    let dir = TempDir::new("soak");
    let program = compile(&dir, "soak", "crates/hcomm-capi/tests/c/soak.c");
    for n in [1, 3] {
        job(&dir, n, &program, &["7", "120"], LIMIT)
            .assert_success(&format!("soak on {n} ranks"))
            .assert_stdout_has(&format!("PASS soak seed 7: 120 calls on {n} ranks"));
    }
}

mod between_hosts_through_libfabric {
    //! The C test programs between hosts through libfabric: two network namespaces
    //! ("hosts", two ranks each) with `HCOMM_TRANSPORT=ofi FI_PROVIDER=tcp`, so that every
    //! message takes libfabric's tcp provider (eager, RDMA read and RDMA write by size): every
    //! collective of the C API against the reference (`collectives.c`), point-to-point, groups
    //! and split (`p2p_groups.c`), and the soak (`soak.c`: random collectives and messages
    //! across 4 KiB and 1 MiB on pool and heap buffers, two seeds).
    //!
    //! Namespaces need root and `ip`, and the transport libfabric: without them each test
    //! says it is skipped, and why, and passes.

    use std::path::{Path, PathBuf};
    use std::time::Duration;

    use super::common::{compile, TempDir};
    use hcomm_testkit::netns::{self, Hosts, PER_HOST};

    /// libfabric's tcp provider, forced; each rank says which provider it took.
    const OFI: [(&str, &str); 3] = [
        ("HCOMM_TRANSPORT", "ofi"),
        ("FI_PROVIDER", "tcp"),
        ("HCOMM_DEBUG", "1"),
    ];
    const LIMIT: Duration = Duration::from_secs(300);

    /// Two hosts and the C program `name` compiled, unless the machine cannot have them.
    fn setup(test: &str, name: &str) -> Option<(Hosts, TempDir, PathBuf)> {
        if !netns::libfabric_loads(test) {
            return None;
        }
        let hosts = Hosts::create(test, 2)?;
        let dir = TempDir::new(name);
        let program = compile(&dir, name, &format!("crates/hcomm-capi/tests/c/{name}.c"));
        Some((hosts, dir, program))
    }

    /// Runs `program args` on every rank of `hosts`; checks that each succeeded through
    /// libfabric's tcp provider and returns the job's output.
    fn run(hosts: &Hosts, program: &Path, args: &[&str]) -> String {
        let mut job = hosts.start(program.to_str().expect("a UTF-8 path"), args, &OFI);
        let status = job.finish(LIMIT);
        let text = job.text();
        for (r, s) in status.iter().enumerate() {
            assert!(s.success(), "rank {r}: {s}\n{text}");
            let line = format!("[{r}] hcomm: rank {r}: libfabric: provider tcp;ofi_rxm");
            assert!(
                text.contains(&line),
                "rank {r} did not use libfabric:\n{text}"
            );
        }
        text
    }

    #[test]
    fn every_c_collective_matches_the_reference_between_hosts_through_libfabric() {
        let Some((hosts, _dir, program)) = setup("c collectives over ofi", "collectives") else {
            return;
        };
        let text = run(&hosts, &program, &[]);
        let n = 2 * PER_HOST;
        assert!(text.contains("PASS collectives"), "{text}");
        assert!(text.contains(&format!("calls on {n} ranks")), "{text}");
    }

    #[test]
    fn c_point_to_point_groups_and_split_between_hosts_through_libfabric() {
        let Some((hosts, _dir, program)) = setup("c p2p_groups over ofi", "p2p_groups") else {
            return;
        };
        let text = run(&hosts, &program, &[]);
        assert!(
            text.contains(&format!("PASS p2p_groups on {} ranks", 2 * PER_HOST)),
            "{text}"
        );
    }

    #[test]
    fn the_c_soak_passes_between_hosts_through_libfabric() {
        let Some((hosts, _dir, program)) = setup("c soak over ofi", "soak") else {
            return;
        };
        for seed in ["1", "20261202"] {
            let text = run(&hosts, &program, &[seed, "150"]);
            let pass = format!("PASS soak seed {seed}: 150 calls on {} ranks", 2 * PER_HOST);
            assert!(text.contains(&pass), "{text}");
            println!(
                "{}",
                text.lines()
                    .filter(|l| l.contains("soak: rank"))
                    .collect::<Vec<_>>()
                    .join("\n")
            );
        }
    }
}
