//! Fault tolerance in jobs of real processes (this test binary started again as each rank):
//! a rank killed with SIGKILL during an all-reduce loop, a second one killed during the
//! shrink, revokes reaching ranks blocked in a receive and in an all-reduce (one revoker,
//! and two at once), revokes with a member already dead (known lost by all, or just killed),
//! a rank stopped with SIGSTOP, shrunk out, then resumed, a shrunk communicator grown again
//! by a new process that joins with a token, and a world of one grown by a second process.
//! Every all-reduce checks exact integer sums; every wait is bounded.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use hcomm::{Communicator, Error, ReduceOp};
use hcomm_testkit::{unix_ns, Ranks};

/// Environment of a rank started by [`start`]: the scenario it runs.
const SCENARIO: &str = "HCOMM_FT_TEST_SCENARIO";
/// Environment: a file whose appearance tells rank 0 to revoke (the SIGSTOP scenario), or the
/// grown ranks to finish (the grow scenario).
const TRIGGER: &str = "HCOMM_FT_TEST_TRIGGER";
/// Environment of a process started to join: the join token.
const TOKEN: &str = "HCOMM_FT_TEST_TOKEN";
/// Elements of each all-reduce.
const COUNT: usize = 1000;
/// Iterations before the ranks say they are looping (and the test may strike).
const WARMUP: u64 = 20;
/// A loop that never meets its failure gives up after this long.
const LOOP_LIMIT: Duration = Duration::from_secs(60);

/// One all-reduce of exact integers, checked: element i of rank r is (i + 1)(r + 1) + k.
fn exact_allreduce(comm: &Communicator, k: u64) -> hcomm::Result<()> {
    let (n, r) = (comm.size() as i64, comm.rank() as i64);
    let k = k as i64;
    let send: Vec<i64> = (0..COUNT as i64).map(|i| (i + 1) * (r + 1) + k).collect();
    let mut recv = vec![0i64; COUNT];
    comm.allreduce(&send, &mut recv, ReduceOp::Sum)?;
    for (i, &got) in recv.iter().enumerate() {
        let want = (i as i64 + 1) * n * (n + 1) / 2 + n * k;
        assert_eq!(got, want, "element {i} of all-reduce {k} on {n} ranks");
    }
    Ok(())
}

/// Open file descriptors and threads of this process.
fn fds_and_threads() -> (usize, usize) {
    let count = |dir: &str| std::fs::read_dir(dir).map_or(0, Iterator::count);
    (count("/proc/self/fd"), count("/proc/self/task"))
}

/// All-reduces until one fails (a member was killed or stopped, or the communicator was
/// revoked); says "LOOPING" after the warm-up. Returns the error.
fn loop_until_failure(comm: &Communicator) -> Error {
    let start = Instant::now();
    let mut k = 0;
    loop {
        if let Err(e) = exact_allreduce(comm, k) {
            return e;
        }
        k += 1;
        if k == WARMUP {
            let (fds, threads) = fds_and_threads();
            println!("LOOPING fds {fds} threads {threads}");
        }
        assert!(
            start.elapsed() < LOOP_LIMIT,
            "no failure came after {k} all-reduces"
        );
    }
}

/// After a failure: revoke, shrink (the survivors agree on the failed set), 100 exact
/// all-reduces on the new communicator; prints the failed set, the new size and the
/// descriptor and thread counts.
fn recover(world: &Communicator, err: &Error) {
    println!("ERROR {:?}", err.code());
    world.revoke().expect("revoke");
    println!("SHRINKING");
    let t = Instant::now();
    let comm = world.shrink().expect("shrink");
    let shrink_us = t.elapsed().as_micros();
    assert_eq!(comm.epoch(), world.epoch() + 1);
    let failed = world.failed();
    // The agreement's flag and failed set: every survivor prints the same.
    world.ack_failed();
    // Rank 1 survives every scenario: the AND is false everywhere.
    let mut flag = world.rank() != 1;
    world.agree(&mut flag).expect("agree after ack");
    for k in 0..100 {
        exact_allreduce(&comm, k).expect("all-reduce after the shrink");
    }
    let (fds, threads) = fds_and_threads();
    println!(
        "RECOVERED failed {failed:?} size {} rank {} flag {flag} fds {fds} threads {threads} \
         shrink_us {shrink_us}",
        comm.size(),
        comm.rank()
    );
}

/// A rank killed during the loop: the survivors recover without it. With `second`, rank 4
/// stays out of the shrink and is killed while the others are in it.
fn killed(world: &Communicator, second: bool) {
    let err = loop_until_failure(world);
    if second && world.rank() == 4 {
        println!("STAYING OUT");
        std::thread::sleep(LOOP_LIMIT);
        panic!("rank 4 was not killed");
    }
    recover(world, &err);
}

/// Rank 0 revokes (and rank 1 too with `two`) while rank 1 (else) waits in a receive no one
/// answers and ranks 2 and 3 in an all-reduce the others do not join; all then shrink (no
/// one failed) and go on.
fn revoke_blocked(world: &Communicator, two: bool) {
    world.barrier().expect("barrier");
    let revoker = world.rank() == 0 || (two && world.rank() == 1);
    let got = if revoker {
        std::thread::sleep(Duration::from_millis(300));
        println!("REVOKE AT {}", unix_ns());
        world.revoke().expect("revoke");
        None
    } else if world.rank() == 1 {
        let mut buf = [0u8; 8];
        Some(world.recv(&mut buf, 2, 5).map(drop))
    } else {
        Some(exact_allreduce(world, 0))
    };
    if let Some(got) = got {
        let at = unix_ns();
        match got {
            Err(Error::Revoked(_)) => println!("REVOKED AT {at}"),
            other => panic!("expected Revoked, got {other:?}"),
        }
    }
    assert!(world.is_revoked());
    assert!(matches!(exact_allreduce(world, 1), Err(Error::Revoked(_))));
    let comm = world.shrink().expect("shrink");
    assert_eq!(comm.size(), world.size());
    for k in 0..10 {
        exact_allreduce(&comm, k).expect("all-reduce after the shrink");
    }
    println!("RECOVERED failed {:?} size {}", world.failed(), comm.size());
}

/// A revoke with rank 3 dead. `known`: rank 3 is killed during the loop and every survivor
/// knows it lost before rank 0 revokes. Otherwise the test kills rank 3 while ranks 1 to 3
/// wait in a receive from rank 0, and rank 0 revokes as soon as the test says so (the trigger
/// file), before it or the others may have noticed: the notices to rank 3 go to a dead
/// process. Either way the revoke returns at once, reaches ranks 1 and 2 (blocked in a receive
/// from rank 0 that nothing answers), and the three shrink without rank 3.
fn revoke_lost(world: &Communicator, known: bool) {
    let start = Instant::now();
    if known {
        let err = loop_until_failure(world);
        println!("ERROR {:?}", err.code());
        while world.failed() != [3] {
            assert!(start.elapsed() < LOOP_LIMIT, "rank 3's loss was not seen");
            std::thread::sleep(Duration::from_millis(5));
        }
    } else {
        world.barrier().expect("barrier");
    }
    if world.rank() == 0 {
        let mut buf = [0u8; 1];
        if known {
            for peer in [1, 2] {
                world.recv(&mut buf, peer, 11).expect("a survivor's word");
            }
            std::thread::sleep(Duration::from_millis(100));
        } else {
            let trigger = PathBuf::from(std::env::var(TRIGGER).expect("the trigger path"));
            while !trigger.exists() {
                assert!(start.elapsed() < LOOP_LIMIT, "no trigger came");
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        let knew = world.failed();
        println!("REVOKE AT {} knowing {knew:?}", unix_ns());
        world.revoke().expect("revoke with a member lost");
        println!("RETURNED AT {}", unix_ns());
    } else {
        if known {
            world.send(&[1u8], 0, 11).expect("word to rank 0");
        } else {
            println!("BLOCKED");
        }
        let mut buf = [0u8; 8];
        let got = world.recv(&mut buf, 0, 12);
        let at = unix_ns();
        match got {
            Err(Error::Revoked(_)) => println!("REVOKED AT {at}"),
            other => panic!("expected Revoked, got {other:?}"),
        }
    }
    let comm = world.shrink().expect("shrink");
    for k in 0..100 {
        exact_allreduce(&comm, k).expect("all-reduce after the shrink");
    }
    println!("RECOVERED failed {:?} size {}", world.failed(), comm.size());
}

/// Rank 5 stops itself with SIGSTOP between two iterations; the others, blocked on it, are
/// revoked by rank 0 when the test creates the trigger file, shrink without rank 5 and go on.
/// Resumed, rank 5 sends a message on the old communicator (dropped and counted by rank 0)
/// and then fails with Revoked.
fn stopped(world: &Communicator) {
    let trigger = PathBuf::from(std::env::var(TRIGGER).expect("the trigger path"));
    for k in 0..WARMUP {
        exact_allreduce(world, k).expect("warm-up");
    }
    if world.rank() == 5 {
        println!("STOPPING");
        // SAFETY: raise has no memory preconditions; SIGSTOP stops the whole process until
        // the test sends SIGCONT, after the others shrank.
        let stopped = unsafe { libc::raise(libc::SIGSTOP) };
        assert_eq!(stopped, 0, "raise(SIGSTOP)");
        // Resumed: the first thing is a send of the old epoch (it leaves before the revoke
        // is read unless another thread of this rank read it first).
        let sent = world.send(&[7u8; 8], 0, 9);
        println!("RESUMED send {:?}", sent.as_ref().map_err(Error::code));
        // The call the others gave up fails (they abandoned it, or its revoke is read by
        // then), and so does every later one, with Revoked once the notice is read.
        let until = Instant::now() + Duration::from_secs(20);
        loop {
            match exact_allreduce(world, 0) {
                Err(Error::Revoked(_)) => break,
                Err(_) => assert!(Instant::now() < until, "no Revoked came"),
                Ok(()) => panic!("an all-reduce succeeded on the old communicator"),
            }
        }
        println!("EXCLUDED Revoked");
        return;
    }
    let err = std::thread::scope(|s| {
        if world.rank() == 0 {
            s.spawn(|| {
                let until = Instant::now() + LOOP_LIMIT;
                while !trigger.exists() {
                    assert!(Instant::now() < until, "no trigger came");
                    std::thread::sleep(Duration::from_millis(10));
                }
                world.revoke().expect("revoke");
            });
        }
        exact_allreduce(world, WARMUP).expect_err("rank 5 is stopped")
    });
    assert!(matches!(err, Error::Revoked(_)), "{err:?}");
    let comm = world.shrink_excluding(&[5]).expect("shrink without rank 5");
    assert_eq!(comm.size(), 5);
    for k in 0..100 {
        exact_allreduce(&comm, k).expect("all-reduce after the shrink");
    }
    println!("SHRUNK");
    if world.rank() == 0 {
        let until = Instant::now() + Duration::from_secs(10);
        while comm.protocol_stats().stale_frames == 0 && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
        println!("STALE {}", comm.protocol_stats().stale_frames);
    }
    for k in 0..10 {
        exact_allreduce(&comm, k).expect("all-reduce after the stale frames");
    }
    println!("RECOVERED size {}", comm.size());
}

/// Ranks 1 and 2 of 3 are killed: rank 0 alone is no majority and may not shrink (it cannot
/// tell dead ranks from a partition), but it may leave them out on purpose.
fn alone(world: &Communicator) {
    let err = loop_until_failure(world);
    println!("ERROR {:?}", err.code());
    world.revoke().expect("revoke");
    // Both losses are known before the shrink (it agrees on what it knows).
    let until = Instant::now() + LOOP_LIMIT;
    while world.failed().len() < 2 {
        assert!(Instant::now() < until, "the losses were not seen");
        std::thread::sleep(Duration::from_millis(5));
    }
    match world.shrink() {
        Err(Error::Quorum(e)) => println!("QUORUM {}", e.message),
        other => panic!("expected Quorum, got {:?}", other.map(|c| c.size())),
    }
    let comm = world.shrink_excluding(&[1, 2]).expect("shrink_excluding");
    exact_allreduce(&comm, 7).expect("an all-reduce of one");
    println!("RECOVERED size {}", comm.size());
}

/// The test kills the highest rank after every 20 all-reduces, until one rank is left: each
/// time the survivors revoke and shrink; the last one, alone, is no majority of the two and
/// leaves the dead rank out on purpose.
fn serial(world: &Communicator) {
    let mut comm = world.dup().expect("dup");
    for round in 0.. {
        for k in 0..20 {
            exact_allreduce(&comm, k).expect("all-reduce of a round");
        }
        println!("ROUND {round} size {}", comm.size());
        if comm.size() == 1 {
            return;
        }
        let err = loop_until_failure(&comm);
        comm.revoke().expect("revoke");
        comm = match comm.shrink() {
            Ok(c) => c,
            Err(Error::Quorum(_)) => {
                let dead = comm.failed();
                comm.shrink_excluding(&dead).expect("shrink_excluding")
            }
            Err(e) => panic!("shrink after {err:?}: {e:?}"),
        };
        assert_eq!(comm.epoch(), round + 1);
    }
}

/// Waits (bounded) for the trigger file of the test.
fn wait_for_trigger() {
    let trigger = PathBuf::from(std::env::var(TRIGGER).expect("the trigger path"));
    let until = Instant::now() + LOOP_LIMIT;
    while !trigger.exists() {
        assert!(Instant::now() < until, "no trigger came");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Checks that a grow was refused with `InvalidArgument` saying `why`.
fn refused(grown: hcomm::Result<Communicator>, why: &str) {
    match grown {
        Err(Error::InvalidArgument(e)) => assert!(e.message.contains(why), "{}", e.message),
        other => panic!(
            "a grow that should fail ({why}) gave {:?}",
            other.map(|c| c.size())
        ),
    }
}

/// After the test killed rank 3 of 6, the survivors shrink to 5; rank 0 of the 5 makes a join
/// token, hands it to the others and prints it; the test starts a new process that joins with
/// it. The 5 grow by one (the new process gets rank 5), all-reduce exactly on 6, and find
/// the token refused a second time and on another communicator. They finish, with a barrier
/// of the 6, once the test creates the trigger file.
fn grow(world: &Communicator) {
    let err = loop_until_failure(world);
    println!("ERROR {:?}", err.code());
    world.revoke().expect("revoke");
    let comm = world.shrink().expect("shrink");
    assert_eq!((comm.size(), comm.epoch()), (5, 1));
    let mut buf = [0u8; hcomm::JOIN_TOKEN_MAX];
    if comm.rank() == 0 {
        let token = comm.join_token().expect("join_token");
        buf[..token.len()].copy_from_slice(token.as_bytes());
        println!("TOKEN {token}");
    }
    comm.broadcast(&mut buf, 0).expect("broadcast of the token");
    let len = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    let token = std::str::from_utf8(&buf[..len]).expect("an ASCII token");
    // The token belongs to the shrunk communicator, not to the world it came from.
    refused(world.grow(token, 1), "made for another communicator");
    refused(comm.grow(&forged(token), 1), "not made in this job");
    let t = Instant::now();
    let grown = comm.grow(token, 1).expect("grow");
    let grow_us = t.elapsed().as_micros();
    assert_eq!(
        (grown.size(), grown.rank(), grown.epoch()),
        (6, comm.rank(), 2)
    );
    for k in 0..100 {
        exact_allreduce(&grown, k).expect("all-reduce on the grown communicator");
    }
    refused(comm.grow(token, 1), "already used");
    println!(
        "GROWN size {} rank {} grow_us {grow_us}",
        grown.size(),
        grown.rank()
    );
    wait_for_trigger();
    grown
        .barrier()
        .expect("the last barrier of the grown communicator");
    println!("RECOVERED size {}", grown.size());
}

/// Rank 0 makes a join token that no grow takes: its store closes by itself within
/// `HCOMM_TIMEOUT`, and rank 0's descriptors and threads come back to their counts before the
/// token; then a grow of both ranks with it fails on both, saying it expired. Before that, a
/// capacity too small for a token is refused and starts nothing.
fn token_expires(world: &Communicator) {
    // The links of the pair are up before the counts are taken.
    world.barrier().expect("the first barrier");
    let before = fds_and_threads();
    match world.join_token_within(10) {
        Err(Error::InvalidArgument(e)) => assert!(e.message.contains("nothing was started")),
        other => panic!("a token in 10 bytes: {other:?}"),
    }
    assert_eq!(
        fds_and_threads(),
        before,
        "a refused token started something"
    );
    let mut buf = [0u8; hcomm::JOIN_TOKEN_MAX];
    if world.rank() == 0 {
        let token = world.join_token().expect("join_token");
        buf[..token.len()].copy_from_slice(token.as_bytes());
        let (fds, threads) = fds_and_threads();
        assert!(fds > before.0 && threads > before.1, "no store: {before:?}");
        println!("STORE fds {fds} threads {threads}");
    }
    world
        .broadcast(&mut buf, 0)
        .expect("broadcast of the token");
    let len = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    let token = std::str::from_utf8(&buf[..len]).expect("an ASCII token");
    // Short all-reduces of rank 0's "back to the counts before" until it is: no wait comes
    // near the timeout.
    let t = Instant::now();
    loop {
        let back = world.rank() != 0 || fds_and_threads() == before;
        let mut all = [0i64];
        world
            .allreduce(&[i64::from(back)], &mut all, ReduceOp::Min)
            .expect("all-reduce of the flag");
        if all[0] == 1 {
            break;
        }
        assert!(
            t.elapsed() < LOOP_LIMIT,
            "rank 0's token store is still open: {:?} against {before:?}",
            fds_and_threads()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    println!("CLOSED after {} ms", t.elapsed().as_millis());
    refused(
        world.grow(token, 1),
        "the join token expired: rank 0, which made it",
    );
    println!("EXPIRED");
}

/// A process started alone (a world of one, no launcher, no job secret) makes a token, writes
/// it to the file the test names (as `TRIGGER`) and grows by the process the test starts
/// beside it; both all-reduce exactly on 2.
fn alone_grows() {
    let world = Communicator::init().expect("init");
    assert_eq!(world.size(), 1);
    let token = world.join_token().expect("join_token");
    let path = PathBuf::from(std::env::var(TRIGGER).expect("the token file"));
    std::fs::write(path.with_extension("tmp"), &token).expect("the token file");
    std::fs::rename(path.with_extension("tmp"), &path).expect("the token file");
    let grown = world.grow(&token, 1).expect("grow");
    assert_eq!((grown.size(), grown.rank(), grown.epoch()), (2, 0, 1));
    for k in 0..100 {
        exact_allreduce(&grown, k).expect("all-reduce on the grown communicator");
    }
    grown
        .barrier()
        .expect("the last barrier of the grown communicator");
    println!("GROWN size {}", grown.size());
}

/// The process that joins the one of `alone_grows`, once the token file is there.
fn join_alone() {
    wait_for_trigger();
    let path = std::env::var(TRIGGER).expect("the token file");
    let token = std::fs::read_to_string(path).expect("the token");
    let grown = Communicator::join(&token).expect("join");
    for k in 0..100 {
        exact_allreduce(&grown, k).expect("all-reduce on the grown communicator");
    }
    grown
        .barrier()
        .expect("the last barrier of the grown communicator");
    println!("JOINED rank {} size {}", grown.rank(), grown.size());
}

/// A process started by the test: joins with the token, all-reduces exactly like the
/// members, and waits for the trigger as they do.
fn join(token: &str) {
    // As read from a file or a pipe: the newline after it is no part of it.
    let grown = Communicator::join(&format!("{token}\n")).expect("join");
    println!(
        "JOINED rank {} size {} epoch {}",
        grown.rank(),
        grown.size(),
        grown.epoch()
    );
    for k in 0..100 {
        exact_allreduce(&grown, k).expect("all-reduce on the grown communicator");
    }
    wait_for_trigger();
    grown
        .barrier()
        .expect("the last barrier of the grown communicator");
    println!("DONE");
}

/// A process started by the test with a token already used: refused; and with that token
/// altered: refused by the store, whose key it does not hold.
fn join_again(token: &str) {
    match Communicator::join(&forged(token)) {
        Err(Error::Init(e)) => println!("FORGED REFUSED {}", e.message),
        other => panic!("a forged token joined: {:?}", other.map(|c| c.rank())),
    }
    match Communicator::join(token) {
        Err(Error::InvalidArgument(e)) => println!("REFUSED {}", e.message),
        other => panic!("a used token joined again: {:?}", other.map(|c| c.rank())),
    }
}

/// `token` with the first digit of its key (the fifth field) changed.
fn forged(token: &str) -> String {
    let mut fields: Vec<String> = token.splitn(6, '/').map(str::to_string).collect();
    let key = &mut fields[4];
    let first = if key.starts_with('0') { "1" } else { "0" };
    key.replace_range(..1, first);
    fields.join("/")
}

#[test]
#[ignore = "a rank of a job started by the tests below"]
fn rank_of_a_job() {
    match std::env::var(SCENARIO).as_deref() {
        Ok("alone-grows") => return alone_grows(),
        Ok("join-alone") => return join_alone(),
        _ => {}
    }
    if let Ok(token) = std::env::var(TOKEN) {
        match std::env::var(SCENARIO).as_deref() {
            Ok("join") => join(&token),
            Ok("join-again") => join_again(&token),
            other => panic!("no joining scenario {other:?}"),
        }
        return;
    }
    let world = Communicator::init().expect("init");
    match std::env::var(SCENARIO).as_deref() {
        Ok("killed") => killed(&world, false),
        Ok("killed-twice") => killed(&world, true),
        Ok("revoke-blocked") => revoke_blocked(&world, false),
        Ok("revoke-twice") => revoke_blocked(&world, true),
        Ok("stopped") => stopped(&world),
        Ok("revoke-lost") => revoke_lost(&world, true),
        Ok("revoke-dead") => revoke_lost(&world, false),
        Ok("alone") => alone(&world),
        Ok("serial") => serial(&world),
        Ok("grow") => grow(&world),
        Ok("token-expires") => token_expires(&world),
        other => panic!("no scenario {other:?}"),
    }
}

/// Starts `n` ranks of `scenario` with `env`.
fn start(scenario: &str, n: usize, env: &[(&str, &str)]) -> Ranks {
    let exe = std::env::current_exe().expect("the test binary's path");
    Ranks::start(n, None, &[], |_| {
        let mut c = Command::new(&exe);
        c.args(["--ignored", "--exact", "rank_of_a_job", "--nocapture"])
            .env(SCENARIO, scenario)
            .env("HCOMM_TIMEOUT", "30")
            .envs(env.iter().copied());
        c
    })
}

/// The first line of rank `r` that starts with `prefix`, without it.
fn line<'a>(job: &'a Ranks, r: usize, prefix: &str) -> &'a str {
    job.output[r]
        .iter()
        .find_map(|l| l.strip_prefix(prefix))
        .unwrap_or_else(|| panic!("rank {r} printed no {prefix:?}:\n{}", job.text()))
}

/// A number after `word` in `text`.
fn number_after(text: &str, word: &str) -> u128 {
    let mut it = text.split_whitespace();
    while let Some(w) = it.next() {
        if w == word {
            return it.next().and_then(|v| v.parse().ok()).expect("a number");
        }
    }
    panic!("no {word} in {text:?}")
}

/// Kills `victims[0]` of a 6-rank loop (and `victims[1]` during the shrink), then checks
/// that every survivor recovered with the same failed set, 100 exact all-reduces, and no
/// more descriptors or threads than before the failure.
fn kill_and_recover(env: &[(&str, &str)], second: bool) {
    let n = 6;
    let victims: &[usize] = if second { &[3, 4] } else { &[3] };
    let scenario = if second { "killed-twice" } else { "killed" };
    let mut job = start(scenario, n, env);
    let all: Vec<usize> = (0..n).collect();
    job.wait_for_lines(&all, "LOOPING", Duration::from_secs(60));
    job.kill(victims[0]);
    let survivors: Vec<usize> = all
        .iter()
        .copied()
        .filter(|r| !victims.contains(r))
        .collect();
    if second {
        job.wait_for_lines(&survivors, "SHRINKING", Duration::from_secs(60));
        job.wait_for_lines(&[4], "STAYING OUT", Duration::from_secs(60));
        // The others are in the shrink, waiting for rank 4.
        std::thread::sleep(Duration::from_millis(200));
        job.kill(4);
    }
    job.wait_for_lines(&survivors, "RECOVERED", Duration::from_secs(60));
    let statuses = job.finish(Duration::from_secs(60));
    let want: Vec<usize> = victims
        .iter()
        .copied()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    for (i, &r) in survivors.iter().enumerate() {
        assert!(statuses[r].success(), "rank {r}:\n{}", job.text());
        let rec = line(&job, r, "RECOVERED ");
        assert!(
            rec.starts_with(&format!(
                "failed {:?} size {} rank {i} flag false",
                want,
                n - victims.len()
            )),
            "rank {r}: {rec}\n{}",
            job.text()
        );
        println!("{scenario}: rank {r}: {rec}");
        let before = line(&job, r, "LOOPING ");
        for what in ["fds", "threads"] {
            assert!(
                number_after(rec, what) <= number_after(before, what),
                "rank {r}: {what} before the failure: {before}; after: {rec}"
            );
        }
    }
}

#[test]
fn a_killed_rank_is_agreed_failed_and_the_survivors_shrink_and_go_on_shm() {
    kill_and_recover(&[], false);
}

#[test]
fn a_killed_rank_is_agreed_failed_and_the_survivors_shrink_and_go_on_tcp() {
    kill_and_recover(&[("HCOMM_TRANSPORT", "tcp")], false);
}

#[test]
fn a_second_rank_killed_during_the_shrink_is_left_out_too() {
    kill_and_recover(&[], true);
}

/// Every blocked rank fails with Revoked within 200 ms of the (first) revoke.
fn revoke_reaches_blocked_ranks(scenario: &str, env: &[(&str, &str)]) {
    let n = 4;
    let mut job = start(scenario, n, env);
    let all: Vec<usize> = (0..n).collect();
    job.wait_for_lines(&all, "RECOVERED", Duration::from_secs(60));
    let statuses = job.finish(Duration::from_secs(30));
    let revokers: Vec<usize> = match scenario {
        "revoke-twice" => vec![0, 1],
        _ => vec![0],
    };
    let first = revokers
        .iter()
        .map(|&r| number_after(line(&job, r, "REVOKE "), "AT"))
        .min()
        .expect("a revoker");
    for (r, status) in statuses.iter().enumerate() {
        assert!(status.success(), "rank {r}:\n{}", job.text());
        if !revokers.contains(&r) {
            let at = number_after(line(&job, r, "REVOKED "), "AT");
            let late = at.saturating_sub(first);
            println!("{scenario}: rank {r} failed with Revoked {late} ns after the first revoke");
            assert!(
                late < 200_000_000,
                "rank {r} saw the revoke {late} ns after it:\n{}",
                job.text()
            );
        }
        let rec = line(&job, r, "RECOVERED ");
        assert!(
            rec.starts_with("failed [] size 4"),
            "rank {r}: {rec}\n{}",
            job.text()
        );
    }
}

#[test]
fn a_revoke_reaches_ranks_blocked_in_a_receive_and_an_allreduce_shm() {
    revoke_reaches_blocked_ranks("revoke-blocked", &[]);
}

#[test]
fn a_revoke_reaches_ranks_blocked_in_a_receive_and_an_allreduce_tcp() {
    revoke_reaches_blocked_ranks("revoke-blocked", &[("HCOMM_TRANSPORT", "tcp")]);
}

#[test]
fn two_revokes_at_once() {
    revoke_reaches_blocked_ranks("revoke-twice", &[]);
}

/// A revoke with a dead member (`known`: every survivor knows it lost; else just killed, see
/// `revoke_lost`): it returns at once, reaches the blocked survivors within 200 ms, and they
/// shrink without the dead member.
fn revoke_with_a_dead_member(known: bool, env: &[(&str, &str)]) {
    let trigger = std::env::temp_dir().join(format!("hcomm-ft-dead-{}", unix_ns()));
    let path = trigger.to_str().expect("a UTF-8 path").to_string();
    let mut env = env.to_vec();
    env.push((TRIGGER, &path));
    let scenario = if known { "revoke-lost" } else { "revoke-dead" };
    let mut job = start(scenario, 4, &env);
    if known {
        job.wait_for_lines(&[0, 1, 2, 3], "LOOPING", Duration::from_secs(60));
        job.kill(3);
    } else {
        job.wait_for_lines(&[1, 2, 3], "BLOCKED", Duration::from_secs(60));
        job.kill(3);
        std::fs::write(&trigger, b"go").expect("the trigger file");
    }
    let survivors = [0, 1, 2];
    job.wait_for_lines(&survivors, "RECOVERED", Duration::from_secs(60));
    let statuses = job.finish(Duration::from_secs(30));
    let _ = std::fs::remove_file(&trigger);
    let at = number_after(line(&job, 0, "REVOKE "), "AT");
    let took = number_after(line(&job, 0, "RETURNED "), "AT").saturating_sub(at);
    let knew = line(&job, 0, "REVOKE ")
        .split("knowing ")
        .nth(1)
        .unwrap_or("?");
    println!("{scenario}: the revoke (knowing {knew} lost) returned in {took} ns");
    for r in survivors {
        assert!(statuses[r].success(), "rank {r}:\n{}", job.text());
        if r != 0 {
            let late = number_after(line(&job, r, "REVOKED "), "AT").saturating_sub(at);
            println!("{scenario}: rank {r} failed with Revoked {late} ns after the revoke");
            assert!(late < 200_000_000, "rank {r}: {late} ns:\n{}", job.text());
        }
        let rec = line(&job, r, "RECOVERED ");
        assert_eq!(rec, "failed [3] size 3", "rank {r}:\n{}", job.text());
    }
}

#[test]
fn a_revoke_skips_a_member_already_lost_shm() {
    revoke_with_a_dead_member(true, &[]);
}

#[test]
fn a_revoke_skips_a_member_already_lost_tcp() {
    revoke_with_a_dead_member(true, &[("HCOMM_TRANSPORT", "tcp")]);
}

#[test]
fn a_revoke_right_after_a_member_died_shm() {
    revoke_with_a_dead_member(false, &[]);
}

#[test]
fn a_revoke_right_after_a_member_died_tcp() {
    revoke_with_a_dead_member(false, &[("HCOMM_TRANSPORT", "tcp")]);
}

#[test]
fn a_stopped_rank_shrunk_out_and_resumed_is_revoked_and_its_late_frames_are_dropped() {
    let n = 6;
    let trigger = std::env::temp_dir().join(format!("hcomm-ft-trigger-{}", unix_ns()));
    let path = trigger.to_str().expect("a UTF-8 path").to_string();
    let mut job = start("stopped", n, &[(TRIGGER, &path)]);
    job.wait_for_lines(&[5], "STOPPING", Duration::from_secs(60));
    // Let the others block on rank 5 in their next all-reduce, then have rank 0 revoke.
    std::thread::sleep(Duration::from_millis(300));
    std::fs::write(&trigger, b"go").expect("the trigger file");
    let survivors = [0, 1, 2, 3, 4];
    job.wait_for_lines(&survivors, "SHRUNK", Duration::from_secs(60));
    job.signal(5, libc::SIGCONT);
    job.wait_for_lines(&survivors, "RECOVERED", Duration::from_secs(60));
    job.wait_for_lines(&[5], "EXCLUDED", Duration::from_secs(60));
    let statuses = job.finish(Duration::from_secs(30));
    let _ = std::fs::remove_file(&trigger);
    for (r, status) in statuses.iter().enumerate() {
        assert!(status.success(), "rank {r}:\n{}", job.text());
    }
    // Rank 5's send left before it read the revoke: rank 0 dropped and counted it.
    if line(&job, 5, "RESUMED ") == "send Ok(())" {
        let stale: u64 = line(&job, 0, "STALE ").parse().expect("a count");
        assert!(stale >= 1, "rank 0 counted no stale frame:\n{}", job.text());
    }
}

#[test]
fn a_lone_survivor_is_no_quorum_but_may_leave_the_dead_out_on_purpose() {
    let mut job = start("alone", 3, &[]);
    job.wait_for_lines(&[0, 1, 2], "LOOPING", Duration::from_secs(60));
    job.kill(1);
    job.kill(2);
    job.wait_for_lines(&[0], "RECOVERED", Duration::from_secs(60));
    let statuses = job.finish(Duration::from_secs(30));
    assert!(statuses[0].success(), "{}", job.text());
    let q = line(&job, 0, "QUORUM ");
    assert!(q.contains("only 1 of the 3 members are reachable"), "{q}");
    assert_eq!(line(&job, 0, "RECOVERED "), "size 1");
}

#[test]
fn one_rank_killed_every_20_iterations_until_one_is_left() {
    let n = 6;
    let mut job = start("serial", n, &[]);
    for victim in (1..n).rev() {
        let round = n - 1 - victim;
        let survivors: Vec<usize> = (0..=victim).collect();
        job.wait_for_lines(
            &survivors,
            &format!("ROUND {round} "),
            Duration::from_secs(60),
        );
        job.kill(victim);
    }
    job.wait_for_lines(&[0], "ROUND 5 size 1", Duration::from_secs(60));
    let statuses = job.finish(Duration::from_secs(30));
    assert!(statuses[0].success(), "{}", job.text());
}

/// A process of this test binary started alone (no launcher variables, no job secret) to
/// join with `token` in `scenario`, with `env`; its output within the time limit.
fn joiner(
    scenario: &str,
    token: &str,
    trigger: &str,
    env: &[(&str, &str)],
) -> std::process::Output {
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut c = Command::new(exe);
    c.args(["--ignored", "--exact", "rank_of_a_job", "--nocapture"])
        .env(SCENARIO, scenario)
        .env(TOKEN, token)
        .env(TRIGGER, trigger)
        .env("HCOMM_TIMEOUT", "30")
        .env_remove("HCOMM_JOB_SECRET")
        .envs(env.iter().copied());
    hcomm_testkit::without_launcher_env(&mut c);
    hcomm_testkit::run_bounded(&mut c, Duration::from_secs(90)).0
}

/// After rank 3 of 6 is killed and the survivors shrink to 5, a new process started alone
/// joins with a token and gets rank 5; the 6 all-reduce exactly; the token is refused a second
/// time (to the members and to a second process) and on another communicator.
fn grow_back(env: &[(&str, &str)]) {
    let n = 6;
    let trigger = std::env::temp_dir().join(format!("hcomm-ft-grow-{}", unix_ns()));
    let path = trigger.to_str().expect("a UTF-8 path").to_string();
    let mut ranks_env = vec![(TRIGGER, path.as_str())];
    ranks_env.extend_from_slice(env);
    let mut job = start("grow", n, &ranks_env);
    let all: Vec<usize> = (0..n).collect();
    job.wait_for_lines(&all, "LOOPING", Duration::from_secs(60));
    job.kill(3);
    job.wait_for_lines(&[0], "TOKEN ", Duration::from_secs(60));
    let token = line(&job, 0, "TOKEN ").to_string();
    let first = {
        let (token, path) = (token.clone(), path.clone());
        let env: Vec<(String, String)> = env
            .iter()
            .map(|&(k, v)| (k.to_string(), v.to_string()))
            .collect();
        std::thread::spawn(move || {
            let env: Vec<(&str, &str)> =
                env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            joiner("join", &token, &path, &env)
        })
    };
    let survivors = [0, 1, 2, 4, 5];
    job.wait_for_lines(&survivors, "GROWN", Duration::from_secs(60));
    // The grow took the token's one rank: a second process is refused.
    let again = joiner("join-again", &token, &path, env);
    let again_text = hcomm_testkit::text(&again);
    std::fs::write(&trigger, b"go").expect("the trigger file");
    let statuses = job.finish(Duration::from_secs(60));
    let joined = first.join().expect("the joiner's thread");
    let _ = std::fs::remove_file(&trigger);
    let joined_text = hcomm_testkit::text(&joined);
    for &r in &survivors {
        assert!(statuses[r].success(), "rank {r}:\n{}", job.text());
        let grown = line(&job, r, "GROWN ");
        println!("grow: rank {r}: {grown}");
        let want = if r < 3 { r } else { r - 1 };
        assert!(
            grown.starts_with(&format!("size 6 rank {want} ")),
            "rank {r}: {grown}\n{}",
            job.text()
        );
        assert_eq!(line(&job, r, "RECOVERED "), "size 6");
    }
    assert!(joined.status.success(), "the joiner:\n{joined_text}");
    assert!(
        joined_text.contains("JOINED rank 5 size 6 epoch 2") && joined_text.contains("DONE"),
        "the joiner:\n{joined_text}"
    );
    assert!(again.status.success(), "the second joiner:\n{again_text}");
    assert!(
        again_text.contains("FORGED REFUSED"),
        "the second joiner:\n{again_text}"
    );
    assert!(
        again_text.contains("REFUSED join: the join token was already used"),
        "the second joiner:\n{again_text}"
    );
}

#[test]
fn a_shrunk_communicator_grows_back_with_a_new_process_that_joins_with_a_token_shm() {
    grow_back(&[]);
}

#[test]
fn a_shrunk_communicator_grows_back_with_a_new_process_that_joins_with_a_token_tcp() {
    grow_back(&[("HCOMM_TRANSPORT", "tcp")]);
}

#[test]
fn an_unused_join_token_expires_and_its_store_closes() {
    let timeout = 4;
    let mut job = start(
        "token-expires",
        2,
        &[("HCOMM_TIMEOUT", &timeout.to_string())],
    );
    job.wait_for_lines(&[0, 1], "EXPIRED", Duration::from_secs(60));
    let statuses = job.finish(Duration::from_secs(30));
    assert!(statuses.iter().all(|s| s.success()), "{}", job.text());
    // The store closed at its expiry: not long before HCOMM_TIMEOUT after it opened (the
    // token was made just before the loop began), nor long after it.
    let closed = number_after(line(&job, 0, "CLOSED "), "after");
    assert!(
        (timeout * 1000 - 1000..timeout * 1000 + 5000).contains(&closed),
        "closed after {closed} ms:\n{}",
        job.text()
    );
}

#[test]
fn a_world_of_one_without_a_secret_grows_by_a_process_that_joins() {
    let file = std::env::temp_dir().join(format!("hcomm-ft-alone-{}", unix_ns()));
    let path = file.to_str().expect("a UTF-8 path").to_string();
    let alone = |scenario: &'static str| {
        let path = path.clone();
        std::thread::spawn(move || {
            let exe = std::env::current_exe().expect("the test binary's path");
            let mut c = Command::new(exe);
            c.args(["--ignored", "--exact", "rank_of_a_job", "--nocapture"])
                .env(SCENARIO, scenario)
                .env(TRIGGER, &path)
                .env("HCOMM_TIMEOUT", "30")
                .env_remove("HCOMM_JOB_SECRET");
            hcomm_testkit::without_launcher_env(&mut c);
            hcomm_testkit::run_bounded(&mut c, Duration::from_secs(90)).0
        })
    };
    let (member, joiner) = (alone("alone-grows"), alone("join-alone"));
    let (member, joiner) = (
        member.join().expect("the member's thread"),
        joiner.join().expect("the joiner's thread"),
    );
    let _ = std::fs::remove_file(&file);
    let text = format!(
        "member:\n{}\njoiner:\n{}",
        hcomm_testkit::text(&member),
        hcomm_testkit::text(&joiner)
    );
    assert!(member.status.success() && joiner.status.success(), "{text}");
    assert!(text.contains("GROWN size 2"), "{text}");
    assert!(text.contains("JOINED rank 1 size 2"), "{text}");
}
