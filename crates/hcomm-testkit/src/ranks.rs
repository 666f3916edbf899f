//! Ranks started by hand, without a launcher: one process each with the variables a launcher
//! would set, their output read line by line as it comes, every wait bounded, and every
//! process still running killed when the value is dropped.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, ExitStatus};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A job of ranks started by hand.
pub struct Ranks {
    children: Vec<Child>,
    status: Vec<Option<ExitStatus>>,
    lines: Receiver<(usize, String)>,
    /// Every line each rank printed so far (stdout and stderr).
    pub output: Vec<Vec<String>>,
}

/// Nanoseconds since the Unix epoch, as `hcomm_check peer-loss` prints them.
pub fn unix_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

fn forward(rank: usize, from: impl Read + Send + 'static, to: mpsc::Sender<(usize, String)>) {
    thread::spawn(move || {
        for line in BufReader::new(from).lines() {
            let Ok(line) = line else { break };
            if to.send((rank, line)).is_err() {
                break;
            }
        }
    });
}

impl Ranks {
    /// Starts `n` ranks: `command(r)` is rank r's command (the program, or a wrapper such as
    /// `ip netns exec NS` followed by it, with any variables of that rank), to which `args`,
    /// `HCOMM_RANK`, `HCOMM_SIZE`, `HCOMM_ROOT_ADDR` and a fresh job secret are added (see
    /// [`crate::spawn_ranks`]). Rank 0 serves the rendezvous store at `root`, by default on a
    /// free port of 127.0.0.1.
    pub fn start(
        n: usize,
        root: Option<&str>,
        args: &[&str],
        command: impl Fn(usize) -> Command,
    ) -> Ranks {
        let root = root.map_or_else(crate::local_root, str::to_string);
        let (tx, lines) = mpsc::channel();
        let mut children = crate::spawn_ranks(n, &root, |r| {
            let mut c = command(r);
            c.args(args);
            c
        });
        for (r, child) in children.iter_mut().enumerate() {
            forward(r, child.stdout.take().unwrap(), tx.clone());
            forward(r, child.stderr.take().unwrap(), tx.clone());
        }
        Ranks {
            children,
            status: vec![None; n],
            lines,
            output: vec![Vec::new(); n],
        }
    }

    /// Every line so far, each prefixed with its rank.
    pub fn text(&self) -> String {
        let mut t = String::new();
        for (r, lines) in self.output.iter().enumerate() {
            for l in lines {
                t.push_str(&format!("[{r}] {l}\n"));
            }
        }
        t
    }

    /// Collects output until `done` holds or `limit` passes; returns whether it held.
    fn collect_until(&mut self, limit: Duration, mut done: impl FnMut(&mut Ranks) -> bool) -> bool {
        let until = Instant::now() + limit;
        loop {
            if done(self) {
                return true;
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            let tick = left.min(Duration::from_millis(20));
            match self.lines.recv_timeout(tick) {
                Ok((r, line)) => self.output[r].push(line),
                Err(RecvTimeoutError::Timeout) => {}
                // Every process has closed its output (they may not have exited yet).
                Err(RecvTimeoutError::Disconnected) => thread::sleep(tick),
            }
        }
    }

    /// Waits up to `limit` until every rank of `ranks` printed a line starting with `prefix`;
    /// panics with the output otherwise.
    pub fn wait_for_lines(&mut self, ranks: &[usize], prefix: &str, limit: Duration) {
        let seen = |me: &mut Ranks| {
            ranks
                .iter()
                .all(|&r| me.output[r].iter().any(|l| l.starts_with(prefix)))
        };
        if !self.collect_until(limit, seen) {
            panic!(
                "ranks {ranks:?} did not all print {prefix:?} within {limit:?}:\n{}",
                self.text()
            );
        }
    }

    /// Kills rank `r` with SIGKILL.
    pub fn kill(&mut self, r: usize) {
        self.signal(r, libc::SIGKILL);
        self.status[r] = self.children[r].wait().ok();
    }

    /// Sends rank `r` the signal `sig` (SIGSTOP: the rank hangs, alive).
    pub fn signal(&mut self, r: usize, sig: libc::c_int) {
        let pid = self.children[r].id() as libc::pid_t;
        // SAFETY: kill has no memory preconditions; the child is not reaped before `kill` or
        // `finish` waits for it, so `pid` is still this child's.
        unsafe { libc::kill(pid, sig) };
    }

    /// Waits up to `limit` for every rank to exit and for its output; panics with the output
    /// (after killing the rest) otherwise. Returns the exit statuses.
    pub fn finish(&mut self, limit: Duration) -> Vec<ExitStatus> {
        let exited = |me: &mut Ranks| {
            for (child, status) in me.children.iter_mut().zip(me.status.iter_mut()) {
                if status.is_none() {
                    *status = child.try_wait().ok().flatten();
                }
            }
            me.status.iter().all(Option::is_some)
        };
        let all = self.collect_until(limit, exited);
        // The rest of the output, until the pipes close.
        let until = Instant::now() + Duration::from_secs(5);
        while let Ok((r, line)) = self
            .lines
            .recv_timeout(until.saturating_duration_since(Instant::now()))
        {
            self.output[r].push(line);
        }
        if !all {
            let left: Vec<usize> = (0..self.status.len())
                .filter(|&r| self.status[r].is_none())
                .collect();
            for &r in &left {
                self.kill(r);
            }
            panic!(
                "ranks {left:?} still ran after {limit:?} (killed):\n{}",
                self.text()
            );
        }
        self.status.iter().flatten().copied().collect()
    }
}

impl Drop for Ranks {
    fn drop(&mut self) {
        for (child, status) in self.children.iter_mut().zip(&self.status) {
            if status.is_none() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}
