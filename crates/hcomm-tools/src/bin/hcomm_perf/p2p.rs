//! Point-to-point operations between ranks 0 and 1.
//!
//! Rank 0 drives: before each size it sends rank 1 a plan (operation, size, warm-up,
//! window, checks), after the warm-up the number of timed iterations, and at the end a
//! "done" message with the total of wrong bytes. Rank 1 checks the plan against its own
//! arguments, so ranks started with different options fail with a clear message instead of
//! hanging.

use anyhow::{bail, Context as _};
use hcomm::Communicator;

use hcomm_tools::{alloc_zeroed as alloc, pattern};

use super::{measure, Outcome, Report, Row, SweepArgs, Traffic};

/// Tag of rank 0's data messages.
const TAG_DATA: u32 = 1;
/// Tag of rank 1's replies (pingpong) and acknowledgements (stream).
const TAG_REPLY: u32 = 2;
/// Tag of the control messages (plan, iteration count, wrong counts, done).
const TAG_CONTROL: u32 = 0x7065_7266;
/// First word of a plan message.
const MSG_PLAN: u64 = 0x504c_414e;
/// First word of the final message.
const MSG_DONE: u64 = 0x444f_4e45;
/// First word of the message rank 0 sends when it stops on an error.
const MSG_ABORT: u64 = 0x4142_5254;
/// Words in a plan or done message.
const CONTROL_WORDS: usize = 6;

/// Which point-to-point pattern to time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// Send and reply; half the round trip.
    PingPong,
    /// A window of nonblocking sends and one acknowledgement.
    Stream {
        /// Most messages in a window.
        window: u64,
        /// Largest window x size.
        window_bytes: u64,
    },
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::PingPong => "pingpong",
            Kind::Stream { .. } => "stream",
        }
    }

    fn code(self) -> u64 {
        match self {
            Kind::PingPong => 1,
            Kind::Stream { .. } => 2,
        }
    }

    /// Messages per iteration for `size` bytes.
    fn window(self, size: u64) -> u64 {
        match self {
            Kind::PingPong => 1,
            Kind::Stream {
                window,
                window_bytes,
            } => (window_bytes / size.max(1)).clamp(1, window),
        }
    }

    /// The part of one iteration's time that counts as one operation.
    fn time_fraction(self, size: u64) -> f64 {
        match self {
            Kind::PingPong => 0.5,
            Kind::Stream { .. } => 1.0 / self.window(size) as f64,
        }
    }
}

/// Runs the sweep on this rank. Ranks other than 0 and 1 only join and leave.
pub(super) fn run(
    comm: &Communicator,
    kind: Kind,
    args: &SweepArgs,
    sizes: &[u64],
) -> anyhow::Result<Outcome> {
    if comm.size() < 2 {
        bail!(
            "{} needs at least 2 ranks, the job has {}: start it with `hcommrun -n 2`",
            kind.name(),
            comm.size()
        );
    }
    match comm.rank() {
        0 => lead(comm, kind, args, sizes),
        1 => follow(comm, kind, args, sizes),
        _ => Ok(Outcome::Passed),
    }
}

/// Rank 0: runs [`lead_sweep`]; when it fails, tells rank 1 (if it is listening) so
/// that it stops at once instead of waiting for `HCOMM_TIMEOUT`.
fn lead(
    comm: &Communicator,
    kind: Kind,
    args: &SweepArgs,
    sizes: &[u64],
) -> anyhow::Result<Outcome> {
    let result = lead_sweep(comm, kind, args, sizes);
    if result.is_err() {
        // Best effort: the original error is what matters.
        let _ = send_words(comm, &[MSG_ABORT, kind.code(), 0, 0, 0, 0]);
    }
    result
}

/// Rank 0: times every size, collects the checks, prints and writes the report.
fn lead_sweep(
    comm: &Communicator,
    kind: Kind,
    args: &SweepArgs,
    sizes: &[u64],
) -> anyhow::Result<Outcome> {
    let mut report = Report::new(args)?;
    let cfg = comm.config();
    let iters = match args.iters {
        Some(n) => format!("{n} iterations"),
        None => format!("~{} s per size", args.time_target),
    };
    report.comment(&format!(
        "hcomm_perf {} {}\n\
         ranks: {} (0 and 1 take part), sizes {}..{} B, {iters}, checked iterations: {}\n\
         hcomm: tcp streams {}, eager limit {} B, chunk {} B, timeout {:.0} s\n\
         time = median per {}; algbw = size/time (1 GB = 1e9 B); busbw = algbw",
        kind.name(),
        env!("CARGO_PKG_VERSION"),
        comm.size(),
        sizes.first().copied().unwrap_or(0),
        sizes.last().copied().unwrap_or(0),
        args.check,
        cfg.tcp_streams,
        cfg.tcp_eager_limit,
        cfg.tcp_chunk,
        cfg.timeout.as_secs_f64(),
        match kind {
            Kind::PingPong => "half round trip",
            Kind::Stream { .. } => "message in a window of nonblocking sends",
        },
    ))?;
    report.header(false)?;
    let mut total_wrong = 0u64;
    for &size in sizes {
        let mut bench = Bench::new(comm, kind, size)?;
        let warmup = args.warmup_for(size);
        send_words(
            comm,
            &[
                MSG_PLAN,
                kind.code(),
                size,
                warmup,
                bench.window as u64,
                args.check,
            ],
        )?;
        let per_iter = measure::warm_up(warmup, || bench.iteration())?;
        let iters = args.iters_for(per_iter);
        send_words(comm, &[iters])?;
        let median = measure::median_time(iters, || bench.iteration())?;
        let mut wrong = bench.length_errors;
        for k in 0..args.check {
            wrong += bench.checked_iteration(k)?;
        }
        let [theirs] = recv_words::<1>(comm, "the wrong-byte count")?;
        wrong += theirs;
        total_wrong += wrong;
        let median = median * kind.time_fraction(size);
        let algbw = if median > 0.0 {
            size as f64 / median / 1e9
        } else {
            0.0
        };
        report.row(Row {
            collective: kind.name(),
            size,
            count: size,
            dtype: "uint8",
            redop: None,
            root: None,
            time_us: median * 1e6,
            algbw,
            busbw: algbw,
            wrong,
            algo: None,
            curve: None,
        })?;
    }
    let mut traffic = Traffic::default();
    traffic.add(comm);
    report.comment(&traffic.line(comm))?;
    report.finish(&format!("{}, ranks 0 and 1", kind.name()))?;
    send_words(comm, &[MSG_DONE, kind.code(), total_wrong, 0, 0, 0])?;
    Ok(if total_wrong == 0 {
        Outcome::Passed
    } else {
        Outcome::Wrong(total_wrong)
    })
}

/// Rank 1: follows rank 0's plan.
fn follow(
    comm: &Communicator,
    kind: Kind,
    args: &SweepArgs,
    sizes: &[u64],
) -> anyhow::Result<Outcome> {
    let mut expected = sizes.iter();
    loop {
        let [what, code, a, b, c, d] = recv_words::<CONTROL_WORDS>(comm, "rank 0's plan")?;
        if code != kind.code() {
            bail!(
                "rank 0 runs a different operation than this rank ({}): start every rank \
                 with the same arguments",
                kind.name()
            );
        }
        if what == MSG_DONE {
            return Ok(if a == 0 {
                Outcome::Passed
            } else {
                Outcome::Wrong(a)
            });
        }
        if what != MSG_PLAN {
            bail!("rank 0 sent an unknown control message ({what:#x})");
        }
        let (size, warmup, window, checks) = (a, b, c, d);
        if expected.next() != Some(&size) {
            bail!(
                "rank 0 wants size {size}, which is not next in this rank's sweep: start \
                 every rank with the same -b/-e/-f/-i"
            );
        }
        let mut bench = Bench::new(comm, kind, size)?;
        if bench.window as u64 != window || checks != args.check {
            bail!(
                "rank 0 uses a window of {window} and {checks} checked iterations, this rank \
                 {} and {}: start every rank with the same arguments",
                bench.window,
                args.check
            );
        }
        for _ in 0..warmup {
            bench.iteration()?;
        }
        let [iters] = recv_words::<1>(comm, "the iteration count")?;
        for _ in 0..iters {
            bench.iteration()?;
        }
        let mut wrong = bench.length_errors;
        for k in 0..checks {
            wrong += bench.checked_iteration(k)?;
        }
        send_words(comm, &[wrong])?;
    }
}

/// Sends little-endian words to the other rank of the pair on the control tag.
fn send_words(comm: &Communicator, words: &[u64]) -> anyhow::Result<()> {
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    let peer = 1 - comm.rank();
    comm.send(&bytes, peer, TAG_CONTROL)
        .with_context(|| format!("sending a control message to rank {peer}"))
}

/// Receives exactly `N` little-endian words from the other rank of the pair.
fn recv_words<const N: usize>(comm: &Communicator, what: &str) -> anyhow::Result<[u64; N]> {
    let peer = 1 - comm.rank();
    // Room for more than expected, so that a longer message (rank 0's abort, or another
    // version's) is reported, not truncated.
    let mut bytes = vec![0u8; (N.max(CONTROL_WORDS) + 1) * 8];
    let len = comm
        .recv(&mut bytes, peer, TAG_CONTROL)
        .with_context(|| format!("receiving {what} from rank {peer}"))?;
    if len == CONTROL_WORDS * 8 && bytes[..8] == MSG_ABORT.to_le_bytes() {
        bail!("rank {peer} stopped on an error (see its output)");
    }
    if len != N * 8 {
        bail!(
            "rank {peer} sent {len} bytes for {what}, expected {}: are both ranks the same \
             hcomm_perf version?",
            N * 8
        );
    }
    let mut words = [0u64; N];
    for (w, chunk) in words.iter_mut().zip(bytes.chunks_exact(8)) {
        let mut b = [0u8; 8];
        b.copy_from_slice(chunk);
        *w = u64::from_le_bytes(b);
    }
    Ok(words)
}

/// One rank's buffers for one size.
struct Bench<'a> {
    comm: &'a Communicator,
    kind: Kind,
    rank: usize,
    size: usize,
    /// Messages per iteration.
    window: usize,
    /// Rank 0: the messages to send. Rank 1: the receive buffers (stream) or the reply
    /// (pingpong). Empty while lent to nonblocking requests.
    bufs: Vec<Vec<u8>>,
    /// Rank 0: the reply buffer (pingpong). Rank 1: the receive buffer (pingpong).
    other: Vec<u8>,
    /// Bytes missing or extra in received messages, over all iterations.
    length_errors: u64,
}

impl<'a> Bench<'a> {
    fn new(comm: &'a Communicator, kind: Kind, size: u64) -> anyhow::Result<Bench<'a>> {
        let size = usize::try_from(size)
            .with_context(|| format!("{size} bytes do not fit in this machine's memory"))?;
        let window = usize::try_from(kind.window(size as u64)).unwrap_or(1);
        let rank = comm.rank();
        let mut bufs = Vec::with_capacity(window);
        for j in 0..window {
            let mut b = alloc(size)?;
            pattern::fill(&mut b, pattern::seed(rank, size, u64::MAX, j));
            bufs.push(b);
        }
        let other = match kind {
            Kind::PingPong => alloc(size)?,
            Kind::Stream { .. } => Vec::new(),
        };
        Ok(Bench {
            comm,
            kind,
            rank,
            size,
            window,
            bufs,
            other,
            length_errors: 0,
        })
    }

    /// One unchecked iteration (its time is what rank 0 measures).
    fn iteration(&mut self) -> anyhow::Result<()> {
        match self.kind {
            Kind::PingPong => self.pingpong(),
            Kind::Stream { .. } => self.stream(),
        }
    }

    fn pingpong(&mut self) -> anyhow::Result<()> {
        let c = self.comm;
        if self.rank == 0 {
            c.send(&self.bufs[0], 1, TAG_DATA)
                .context("pingpong: sending to rank 1")?;
            let n = c
                .recv(&mut self.other, 1, TAG_REPLY)
                .context("pingpong: receiving from rank 1")?;
            self.note_length(n);
        } else {
            let n = c
                .recv(&mut self.other, 0, TAG_DATA)
                .context("pingpong: receiving from rank 0")?;
            self.note_length(n);
            c.send(&self.bufs[0], 0, TAG_REPLY)
                .context("pingpong: replying to rank 0")?;
        }
        Ok(())
    }

    fn stream(&mut self) -> anyhow::Result<()> {
        let c = self.comm;
        let bufs = std::mem::take(&mut self.bufs);
        if self.rank == 0 {
            let reqs = bufs
                .into_iter()
                .map(|b| c.isend(b, 1, TAG_DATA))
                .collect::<hcomm::Result<Vec<_>>>()
                .context("stream: starting a send to rank 1")?;
            let done = hcomm::wait_all(reqs).context("stream: sending to rank 1")?;
            self.bufs = done.into_iter().map(|d| d.buffer).collect();
            c.recv(&mut [], 1, TAG_REPLY)
                .context("stream: receiving the acknowledgement of rank 1")?;
        } else {
            let reqs = bufs
                .into_iter()
                .map(|b| c.irecv(b, 0, TAG_DATA))
                .collect::<hcomm::Result<Vec<_>>>()
                .context("stream: starting a receive from rank 0")?;
            let done = hcomm::wait_all(reqs).context("stream: receiving from rank 0")?;
            let mut bufs = Vec::with_capacity(done.len());
            for d in done {
                self.note_length(d.len);
                bufs.push(d.buffer);
            }
            self.bufs = bufs;
            c.send(&[], 0, TAG_REPLY)
                .context("stream: acknowledging to rank 0")?;
        }
        Ok(())
    }

    /// Counts a received length other than the size as that many wrong bytes.
    fn note_length(&mut self, len: usize) {
        self.length_errors += len.abs_diff(self.size) as u64;
    }

    /// One iteration on fresh data (pattern `k`); returns this rank's wrong bytes.
    fn checked_iteration(&mut self, k: u64) -> anyhow::Result<u64> {
        let size = self.size;
        // The sender fills its messages; the receiver fills its buffers with the
        // complement of what it expects, so every byte not written counts as wrong.
        let (sender, receiver) = match self.kind {
            Kind::PingPong => (self.rank, 1 - self.rank),
            Kind::Stream { .. } => (0, 1),
        };
        let mine = pattern::seed(self.rank, size, k, 0);
        match self.kind {
            Kind::PingPong => {
                pattern::fill(&mut self.bufs[0], mine);
                let theirs = pattern::seed(1 - self.rank, size, k, 0);
                pattern::fill_complement(&mut self.other, theirs);
            }
            Kind::Stream { .. } => {
                for (j, b) in self.bufs.iter_mut().enumerate() {
                    let s = pattern::seed(sender, size, k, j);
                    if self.rank == receiver {
                        pattern::fill_complement(b, s);
                    } else {
                        pattern::fill(b, s);
                    }
                }
            }
        }
        let before = self.length_errors;
        self.iteration()?;
        let mut wrong = self.length_errors - before;
        match self.kind {
            Kind::PingPong => {
                let theirs = pattern::seed(1 - self.rank, size, k, 0);
                wrong += pattern::count_wrong(&self.other, theirs);
            }
            Kind::Stream { .. } if self.rank == receiver => {
                for (j, b) in self.bufs.iter().enumerate() {
                    wrong += pattern::count_wrong(b, pattern::seed(sender, size, k, j));
                }
            }
            Kind::Stream { .. } => {}
        }
        // Length errors of a checked iteration are already in `wrong`.
        self.length_errors = before;
        Ok(wrong)
    }
}
