//! `hcomm_check`: conformance checks of point-to-point messaging, run under any launcher.
//!
//! Each scenario exchanges data between all ranks and verifies every byte; the test suite
//! runs it under hcommrun, Open MPI and MPICH. Every rank prints `OK <scenario>` on success
//! and exits non-zero with the reason on failure.
//!
//! The scenarios live by subject: [`p2p`] (messages, tags, truncation, timeouts, split,
//! progress), [`coll`] (collectives against the reference, mismatches, determinism, overlap,
//! observed calls), [`soak`], [`failure`] (lost peers, aborts) and [`resources`] (what a
//! process holds, and the life cycle of communicators).

mod coll;
mod direct;
mod failure;
mod p2p;
mod rails;
mod resources;
mod soak;

use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use clap::{Parser, Subcommand};
use hcomm::{Communicator, ReduceOp};

#[derive(Parser)]
#[command(about = "Conformance checks of hcomm's point-to-point layer (run under a launcher)")]
struct Args {
    #[command(subcommand)]
    scenario: Scenario,
}

#[derive(Subcommand, Clone)]
enum Scenario {
    /// Print rank, size and local rank; check a barrier.
    Hello,
    /// Ring exchange (send right, receive left) at sizes 0 B .. --max-size.
    Ring {
        /// Largest message, in bytes.
        #[arg(long, default_value_t = 64 << 20)]
        max_size: usize,
    },
    /// Every rank sends to and receives from every other rank at once (nonblocking). First
    /// every rank prints `listening N threads T tcp C`: its TCP sockets in the listening state
    /// once init is done (its own listener, where peers connect on first use, open for the
    /// whole job; rank 0 of a job without a launcher's store also the store's), its threads,
    /// and the TCP connections it dialed (the store's: links are made on first use; a faster
    /// peer may already have dialed this rank, which is not counted); after the
    /// exchange, once no connection is in its handshake (the one refused when two ranks dialed
    /// each other at once is closed by then), `after all-pairs tcp C`: its connected TCP
    /// sockets then.
    AllPairs {
        /// Largest message, in bytes.
        #[arg(long, default_value_t = 4 << 20)]
        max_size: usize,
    },
    /// Two ranks: a blocking message of every length from 0 to 40 bytes each way, each
    /// received once it is there (through the shared-memory fast box where it fits), into a
    /// longer buffer whose bytes past the message must stay as they were.
    Small,
    /// Messages of one source and tag arrive in order, whatever other tags do.
    Tags,
    /// A message longer than the receive buffer gives Error::Truncated, small and large.
    Truncate,
    /// A receive from a rank that never sends times out (set a short HCOMM_TIMEOUT).
    Timeout,
    /// split and dup give independent communicators.
    Split,
    /// Rank 1 exits with status 3 at once; the others wait for it (launcher failure test).
    Exit,
    /// Two ranks: world rank 0 stops itself (`SIGSTOP`) in the middle of a split message to
    /// rank 1, after claiming its first piece; rank 1's receive fails naming it, then rank 1
    /// continues it and checks that it wrote nothing into the receive buffer (run with a
    /// short HCOMM_TIMEOUT, HCOMM_SPIN_US and a split threshold below 16 MiB).
    SplitStop,
    /// Rank 1 exits with status 3 in the middle of a loop of all-reduces; the others must
    /// fail fast (PeerLost or Aborted), not wait out HCOMM_TIMEOUT.
    CollExit,
    /// A nonblocking send completes while its sender computes without calling hcomm.
    Progress,
    /// Every collective, data type and op against the sequential reference.
    Collectives {
        /// Largest count (elements) tried.
        #[arg(long, default_value_t = 70_000)]
        max_count: usize,
        /// Only this collective.
        #[arg(long)]
        only: Option<String>,
        /// Buffers from the shared-memory pool (`Communicator::alloc`) instead of the heap.
        #[arg(long)]
        pool: bool,
    },
    /// Ranks calling different collectives, counts, types or roots get Error::Mismatch.
    Mismatch,
    /// Ranks configured with different HCOMM_ALGO: their all-reduce reports a mismatch.
    AlgoMismatch,
    /// With HCOMM_DETERMINISTIC=1, float reductions of arbitrary values equal the rank-order
    /// reference bit for bit, whatever HCOMM_ALGO says.
    Deterministic,
    /// Nonblocking collectives on two communicators progress together; a batch of 1000
    /// small all-reduces gives the same results as separate calls.
    Overlap,
    /// Worlds created and destroyed in a row leave no socket or thread behind.
    Lifecycle,
    /// Every collective but the barrier, in place and not, at sizes whose steps straddle the
    /// libfabric thresholds, each checked against the sequential reference; after each
    /// collective, how many of its messages this rank wrote straight into the peer's receive
    /// (`direct KIND N`), then the libfabric counts.
    Direct,
    /// Rounds of collectives in flight at once on the world and a dup of it, whose steps go
    /// straight into the peer's receive through libfabric: a nonblocking all-reduce on each, a
    /// nonblocking barrier and all-gather, then a blocking all-reduce; each result checked,
    /// then how many messages this rank wrote into a peer's receive (`direct overlap N`).
    DirectOverlap {
        /// Rounds.
        #[arg(long, default_value_t = 40)]
        rounds: usize,
    },
    /// Two hosts of two ranks: the first host's ranks abort a direct all-reduce with their
    /// partners on the second while those are stopped (`SIGSTOP`), which revokes the receives
    /// they offered at once (`revoked in N ms`); then every rank runs a checked all-reduce
    /// with its other partner on the other host, through the same endpoint.
    DirectRevoke {
        /// How long the second host's ranks stay stopped, in milliseconds.
        #[arg(long, default_value_t = 4000)]
        stop_ms: u64,
        /// How long after starting the all-reduce the first host's ranks abort it.
        #[arg(long, default_value_t = 500)]
        abort_ms: u64,
    },
    /// Two hosts of two ranks: the second host's ranks send 2 MiB (by RDMA write through
    /// libfabric) to their partner on the first, and are stopped (`SIGSTOP`, steps ordered by
    /// stops of both sides) from announcing the write until well after the first host's
    /// ranks, whose receive named its destination, aborted it, which revokes that destination
    /// at once (`revoked in N ms`); then every rank runs a checked all-reduce with its other
    /// partner on the other host, and each pair exchanges 2 MiB again, checked, through the
    /// same endpoint.
    WriteRevoke {
        /// How long the senders stay stopped after announcing the write, in milliseconds (a
        /// third of it: each earlier stop).
        #[arg(long, default_value_t = 4000)]
        stop_ms: u64,
        /// How long after naming the destination the first host's ranks abort the receive.
        #[arg(long, default_value_t = 300)]
        abort_ms: u64,
    },
    /// Ring exchange at sizes around every protocol threshold (through libfabric, then a
    /// checked all-reduce of 100 000 Int32, whose steps may go direct), then the protocol
    /// counts and the TCP connections the rank opened and accepted (`links ...`).
    Protocols {
        /// This world rank makes itself non-dumpable after joining, so that peers without
        /// `CAP_SYS_PTRACE` are refused cross-memory attach on it after the start-up probe
        /// succeeded (their pulls from it must fall back to the push).
        #[arg(long)]
        nodump: Option<usize>,
        /// Then print `pid P` and run a barrier every 20 ms for this long, for a profiler to
        /// read the rank (0: end at once).
        #[arg(long, default_value_t = 0)]
        linger_ms: u64,
        /// Rounds of the ring exchange (each at every size).
        #[arg(long, default_value_t = 1)]
        rounds: usize,
    },
    /// Ranks 0 and 1 ping-pong messages of every protocol (run with HCOMM_SPIN_US=0, so that
    /// every wait sleeps); then the count of sleeps that ran their whole time. A protocol
    /// whose frames did not wake the sleeper would make nearly every wait of its size one;
    /// the load of a shared host makes a few (a rank woken but kept from running for the
    /// 100 ms of a sleep), so each size may have fewer than a fifth of its round trips so.
    Wakeups {
        /// Each rank pauses this long before it sends, so that its peer's wait surely sleeps;
        /// the counts are then only printed (a peer that the machine's load keeps from running
        /// for 100 ms after its pause also makes a sleep run its whole time).
        #[arg(long, default_value_t = 0)]
        pause_us: u64,
    },
    /// Random collectives (kinds, types, ops, counts, roots, in place or not, heap or pool
    /// memory) on the world and on communicators made by split and dup, each checked against
    /// the sequential reference; every rank draws the same calls from --seed.
    Soak {
        /// Number of calls (on all communicators together).
        #[arg(long, default_value_t = 1000)]
        calls: usize,
        /// Seed of the random calls: the same seed gives the same calls.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Largest count (elements) of a call.
        #[arg(long, default_value_t = 100_000)]
        max_count: usize,
    },
    /// The ranks in --victims are killed while the others wait in a pending operation on
    /// them; the others must fail with PeerLost (or Aborted, when another survivor's abort
    /// reaches them first). Every rank prints `ready <ns>` after the start-up barrier, a victim
    /// that kills itself `killing <ns>` just before, a survivor `lost <ns> <code> world rank
    /// <peer>: <error>` when its operation fails (ns: nanoseconds since the Unix epoch, for
    /// kill-to-error latencies; peer: the world rank in the error's peer field, or `unknown`).
    PeerLoss {
        /// World ranks that die.
        #[arg(long, value_delimiter = ',', required = true)]
        victims: Vec<usize>,
        /// A victim kills itself with SIGKILL this long after the barrier; without it, the
        /// victims wait to be killed from outside (a failure if nobody does).
        #[arg(long)]
        kill_after_ms: Option<u64>,
        /// What the survivors wait in: a receive from the first victim, or a loop of
        /// all-reduces on the world (the victims run it too until they die).
        #[arg(long, value_enum, default_value_t = failure::Pending::Recv)]
        pending: failure::Pending,
    },
    /// Fault tolerance across a partition or a loss: every rank prints `ready <ns>` after
    /// the start-up barrier and all-reduces exact integers in a loop until a call fails (the
    /// test cuts some ranks off, or kills them); then it revokes the world and shrinks it.
    /// A rank on a side holding a strict majority prints `shrunk <size> failed <ranks>`,
    /// checks 10 all-reduces on the new communicator and prints `OK shrink`; a rank of the
    /// minority prints `quorum <error>` and `OK quorum`.
    Shrink,
    /// All-reduces in a loop, checked, for the profiler, stall and trace tests: every rank
    /// prints `pid <pid>` first; rank --late joins call --late-call only after --late-ms (the
    /// others stall in it), and every rank pauses --pause-ms between calls.
    Observe {
        /// Number of all-reduces.
        #[arg(long, default_value_t = 100)]
        calls: usize,
        /// Floats per all-reduce.
        #[arg(long, default_value_t = 1024)]
        count: usize,
        /// Milliseconds between calls.
        #[arg(long, default_value_t = 0)]
        pause_ms: u64,
        /// The rank that comes late to the first call.
        #[arg(long)]
        late: Option<usize>,
        /// How late it comes, in milliseconds.
        #[arg(long, default_value_t = 0)]
        late_ms: u64,
        /// The call it comes late to (from 0; the first call of a shape also sets up).
        #[arg(long, default_value_t = 0)]
        late_call: usize,
    },
    /// All-reduces in a loop where rank --skip never enters call --at: it sleeps --hold-ms
    /// instead (alive, heartbeating). The others' call --at must fail (timeout, or aborted
    /// when another rank's failure reaches them first) naming exactly rank --skip as never
    /// having entered it: they print `not-entered <op> <seq> <ranks> <error>`. With
    /// --mismatch, rank --skip calls a broadcast at --at instead and every rank must fail
    /// (`mismatched <error>`). Rank --skip (every rank, with --mismatch) then dumps its flight
    /// recorder (`Communicator::dump_trace`) and prints `dumped <path>`; the others' failed
    /// calls dumped theirs.
    Stuck {
        /// The rank that skips the call.
        #[arg(long, default_value_t = 1)]
        skip: usize,
        /// The call it skips (from 0).
        #[arg(long, default_value_t = 5)]
        at: usize,
        /// How long it sleeps instead, in milliseconds.
        #[arg(long, default_value_t = 4000)]
        hold_ms: u64,
        /// Call a broadcast instead of skipping.
        #[arg(long)]
        mismatch: bool,
    },
    /// Rank --aborter aborts the world (`Communicator::abort`) while the others, and another
    /// thread of its own, wait in a pending operation; they must fail with Aborted naming it,
    /// as must every later call, while a communicator duplicated before still works.
    /// Every rank prints `ready <ns>` after the start-up barrier, the aborter `aborting <ns>`
    /// just before, the others `aborted <ns> <error>`. Then every rank releases the world and
    /// checks that no thread or socket of hcomm is left; the aborter lingers a second (so that
    /// the others report before the launcher stops them) and exits with status 1.
    Abort {
        /// World rank that aborts.
        #[arg(long, default_value_t = 1)]
        aborter: usize,
        /// What the others wait in: a receive from the aborter, or a loop of all-reduces on
        /// the world (which the aborter never joins).
        #[arg(long, value_enum, default_value_t = failure::Pending::Recv)]
        pending: failure::Pending,
    },
    /// One kind of traffic, then each rank prints `inbox K of M kB`: how much of its
    /// shared-memory inbox has memory (its pages resident in /dev/shm, by `mincore`) and how
    /// large the inbox is, and `tcp N connected`: its connected TCP sockets (the store's
    /// included; counted once no connection is in its handshake); then a dup (a
    /// dissemination among the ranks 1, 2, 4, ... away). The rings of an inbox take memory
    /// only once their peer sends (the barrier's frames of peers that measured first are
    /// counted too).
    InboxUse {
        /// What the ranks do between init and the measurement.
        #[arg(long, value_enum)]
        traffic: resources::Traffic,
    },
    /// Ranks pair up (0 with 1, 2 with 3, ...) and exchange a message, then pass a barrier;
    /// the upper half finalizes (each prints `finalize MS`) and stays alive until --done
    /// exists (a minute at most), while each rank of the lower half receives from every rank
    /// of the upper half, a receive that must fail as a finalize (PeerLost, "has finalized"),
    /// not as a loss or a timeout: they never sent to it, and say so only by the mark of their
    /// inbox. A rank of the lower half prints `finalized PEER MS` per receive (how long it
    /// waited) and `inbox B A kB`: the memory of its inbox before the upper half finalized
    /// and after (no goodbye went through its rings); rank 0 then creates --done. One host,
    /// an even number of ranks, 4 or more.
    QuietFinalize {
        /// The file rank 0 creates when it is done.
        #[arg(long)]
        done: std::path::PathBuf,
    },
    /// After a barrier rank 1 kills itself with SIGKILL; the others run all-reduces and must
    /// fail fast with PeerLost naming it.
    Kill {
        /// Rank 1 first takes pool memory no peer has mapped (its block's name is left for
        /// hcommrun to sweep).
        #[arg(long)]
        pool: bool,
        /// Bytes of pool memory rank 1 takes with --pool (beyond HCOMM_POOL_BLOCK: a grown
        /// block).
        #[arg(long, default_value_t = 1 << 20)]
        pool_bytes: usize,
    },
    /// Checked traffic in a loop for the failover tests (see `rails.rs`): every rank prints
    /// `step K US` every --every steps (US: microseconds since the start), then `failovers N`
    /// (its `tcp_failovers`), `pid P` and a barrier every 20 ms for --linger-ms (a profiler
    /// may read the rank meanwhile), and `took MS`.
    Rails {
        /// What the ranks exchange.
        #[arg(long, value_enum)]
        traffic: rails::Traffic,
        /// Exchanges.
        #[arg(long, default_value_t = 100)]
        count: usize,
        /// Bytes of an all-reduce, or of every fourth ordered message.
        #[arg(long, default_value_t = 1 << 20)]
        bytes: usize,
        /// Steps between progress lines.
        #[arg(long, default_value_t = 1)]
        every: usize,
        /// Microseconds each rank pauses after each step.
        #[arg(long, default_value_t = 0)]
        pause_us: u64,
        /// Milliseconds the ranks stay after the traffic, in barriers.
        #[arg(long, default_value_t = 0)]
        linger_ms: u64,
    },
    /// Every collective with a one-sided form, on heap buffers beyond the size that goes
    /// through the shared slots (in place and not, every root in turn), each result checked
    /// against the reference; then `onesided calls C of T messages M`: how many of the T
    /// calls ran under the one-sided algorithm, and the messages this rank moved meanwhile
    /// (sent eagerly, pushed, or pulled: a pull counts at the receiver), none when every
    /// call ran one-sided (they move no message).
    OneSided {
        /// This world rank makes itself non-dumpable once every link is made and the
        /// communicator's one-sided state exists, so that peers without `CAP_SYS_PTRACE`
        /// would be refused cross-memory attach on it: the calls must take their message
        /// schedules instead, with the same results.
        #[arg(long)]
        nodump: Option<usize>,
        /// Instead: each collective once out of place and once in place (1 MiB + 12 B of
        /// Int32 blocks), each on a fresh dup of the world, in which this world rank turns
        /// non-dumpable inside the call (after its check, with no warning: its peers are
        /// refused cross-memory attach in the middle of the call), then dumpable again.
        /// Each rank prints `midcall KIND in-place|out-of-place ok|refused moved M`: the
        /// call's checked result, or its error saying it was refused in place, and the
        /// messages this rank moved in it (a call done again by its schedule moves some).
        #[arg(long, conflicts_with = "nodump")]
        nodump_mid: Option<usize>,
    },
    /// All-reduce (float32 sum) and broadcast on pool buffers of --bytes bytes each, which
    /// the pool must serve, with every result checked; then the same again on fresh
    /// buffers, which must reuse the freed blocks.
    BigPool {
        /// Bytes of each buffer.
        #[arg(long, default_value_t = 256 << 20)]
        bytes: usize,
        /// The pool must miss instead (a /dev/shm too small): the buffers come from the heap.
        #[arg(long)]
        heap: bool,
    },
}

fn run(scenario: Scenario) -> Result<()> {
    let before = resources::footprint()?;
    let comm = Communicator::init().context("init")?;
    let name = match scenario {
        Scenario::Hello => {
            println!(
                "rank {} of {} local {} of {} launcher {:?}",
                comm.rank(),
                comm.size(),
                comm.local_rank(),
                comm.local_size(),
                comm.config().launch.launcher
            );
            comm.barrier()?;
            "hello"
        }
        Scenario::Ring { max_size } => {
            p2p::ring(&comm, max_size)?;
            "ring"
        }
        Scenario::AllPairs { max_size } => {
            let threads = std::fs::read_dir("/proc/self/task")?.count();
            // Dialed only: a faster peer may already have connected to this rank.
            let tcp = resources::tcp_sockets()?;
            println!(
                "listening {} threads {threads} tcp {}",
                tcp.listening.len(),
                tcp.dialed.len()
            );
            println!(
                "dialed {} (listening on {})",
                tcp.dialed.join(", "),
                tcp.listening.join(", ")
            );
            p2p::all_pairs(&comm, max_size)?;
            resources::handshakes_ended()?;
            println!(
                "after all-pairs tcp {}",
                resources::tcp_sockets()?.connected
            );
            // No rank finalizes (and closes its connections) before every rank counted.
            comm.barrier()?;
            "all-pairs"
        }
        Scenario::Small => {
            p2p::small(&comm)?;
            "small"
        }
        Scenario::Tags => {
            p2p::tags(&comm)?;
            "tags"
        }
        Scenario::Truncate => {
            p2p::truncate(&comm)?;
            "truncate"
        }
        Scenario::Timeout => {
            p2p::timeout(&comm)?;
            "timeout"
        }
        Scenario::Split => {
            p2p::split(&comm)?;
            "split"
        }
        Scenario::Progress => {
            p2p::progress(&comm)?;
            "progress"
        }
        Scenario::Collectives {
            max_count,
            only,
            pool,
        } => {
            coll::collectives(&comm, max_count, only.as_deref(), pool)?;
            "collectives"
        }
        Scenario::Mismatch => {
            coll::mismatch(&comm)?;
            "mismatch"
        }
        Scenario::AlgoMismatch => {
            let mut buf = vec![1.0f32; 4096];
            let res = comm.allreduce_in_place(&mut buf, ReduceOp::Sum);
            coll::expect_mismatch(&comm, "algorithm", res)?;
            "algo-mismatch"
        }
        Scenario::Deterministic => {
            coll::deterministic(&comm)?;
            "deterministic"
        }
        Scenario::Overlap => {
            coll::overlap(&comm)?;
            "overlap"
        }
        Scenario::Lifecycle => {
            return resources::lifecycle(comm).map(|()| println!("OK lifecycle"))
        }
        Scenario::Soak {
            calls,
            seed,
            max_count,
        } => {
            soak::soak(&comm, calls, seed, max_count)?;
            "soak"
        }
        Scenario::PeerLoss {
            victims,
            kill_after_ms,
            pending,
        } => {
            return failure::peer_loss(comm, &victims, kill_after_ms, pending, before)
                .map(|()| println!("OK peer-loss"));
        }
        Scenario::Shrink => return failure::shrink(&comm),
        Scenario::Observe {
            calls,
            count,
            pause_ms,
            late,
            late_ms,
            late_call,
        } => {
            let late = late.map(|rank| (rank, late_call, Duration::from_millis(late_ms)));
            coll::observe(&comm, calls, count, pause_ms, late)?;
            "observe"
        }
        Scenario::Stuck {
            skip,
            at,
            hold_ms,
            mismatch,
        } => {
            coll::stuck(&comm, skip, at, Duration::from_millis(hold_ms), mismatch)?;
            "stuck"
        }
        Scenario::Abort { aborter, pending } => {
            return failure::abort(comm, aborter, pending, before).map(|()| println!("OK abort"));
        }
        Scenario::Rails {
            traffic,
            count,
            bytes,
            every,
            pause_us,
            linger_ms,
        } => {
            let pause = Duration::from_micros(pause_us);
            let linger = Duration::from_millis(linger_ms);
            rails::rails(&comm, traffic, count, bytes, every, pause, linger)?;
            "rails"
        }
        Scenario::DirectOverlap { rounds } => {
            direct::direct_overlap(&comm, rounds)?;
            "direct-overlap"
        }
        Scenario::DirectRevoke { stop_ms, abort_ms } => {
            direct::direct_revoke(&comm, stop_ms, abort_ms)?;
            "direct-revoke"
        }
        Scenario::WriteRevoke { stop_ms, abort_ms } => {
            direct::write_revoke(&comm, stop_ms, abort_ms)?;
            "write-revoke"
        }
        Scenario::Direct => {
            direct::direct(&comm)?;
            "direct"
        }
        Scenario::Protocols {
            nodump,
            linger_ms,
            rounds,
        } => {
            // Links are made on first use, and each end probes cross-memory attach then: every
            // link is made (and probed) before the rank turns non-dumpable, so only the pulls
            // fail, not the probes; the counts below leave these first messages out.
            let before = if let Some(rank) = nodump {
                p2p::links_then_nodump(&comm, rank)?;
                comm.protocol_stats()
            } else {
                hcomm::ProtocolStats::default()
            };
            let c = comm.config();
            let (eager, push) = (c.shm_eager_limit, c.shm_push_threshold);
            // Past the push threshold when there is one below 64 MiB, else 1 MiB: pulls in
            // several pieces.
            let big = if push < 64 << 20 { push } else { 1 << 20 };
            let mut sizes = vec![0, 1, eager, eager + 1, big, big + 1, 3 * big + 5];
            if c.transport.as_deref() == Some("ofi") {
                let (inline, write) = (c.ofi_eager_limit, c.ofi_write_threshold);
                sizes.extend([inline, inline + 1, write, write + 1, 3 * write + 5]);
            }
            // Each size once (the thresholds of libfabric and shared memory may coincide: the
            // counts then stay those of each transport's own sizes).
            sizes.retain(|&s| s <= 64 << 20);
            sizes.sort_unstable();
            sizes.dedup();
            for _ in 0..rounds {
                p2p::ring_sizes(&comm, sizes.clone())?;
            }
            if c.transport.as_deref() == Some("ofi") {
                // A collective too, whose steps between hosts go direct (when they may).
                direct::checked_sum(&comm)?;
            }
            let s = comm.protocol_stats();
            let right = (comm.rank() + 1) % comm.size();
            println!(
                "protocols shm={} shm_eager={} shm_pull={} shm_push={} tcp_eager={} tcp_rendezvous={}",
                comm.uses_shm(right),
                s.shm_eager - before.shm_eager,
                s.shm_pull - before.shm_pull,
                s.shm_push - before.shm_push,
                s.tcp_eager - before.tcp_eager,
                s.tcp_rendezvous - before.tcp_rendezvous
            );
            println!(
                "split shm_split={} written={}",
                s.shm_split - before.shm_split,
                s.shm_split_written - before.shm_split_written
            );
            println!(
                "links tcp_opened={} tcp_accepted={}",
                s.tcp_opened, s.tcp_accepted
            );
            println!(
                "ofi eager={} read={} write={} direct={} mr_hits={} mr_misses={} mr_pool={} \
                 pool_blocks={}",
                s.ofi_eager,
                s.ofi_read,
                s.ofi_write,
                s.ofi_direct,
                s.ofi_mr_hits,
                s.ofi_mr_misses,
                s.ofi_mr_pool,
                s.ofi_pool_blocks
            );
            rails::linger_for_a_profiler(&comm, Duration::from_millis(linger_ms))?;
            "protocols"
        }
        Scenario::Wakeups { pause_us } => {
            let pause = || std::thread::sleep(Duration::from_micros(pause_us));
            let c = comm.config();
            let sizes = [
                8,
                c.shm_eager_limit + 1,
                c.shm_push_threshold.min(1 << 20) + 1,
            ];
            let me = comm.rank();
            const ROUND_TRIPS: u64 = 50;
            let mut full_by_size = Vec::with_capacity(sizes.len());
            for (round, &len) in sizes.iter().enumerate() {
                let full_before = comm.protocol_stats().full_naps;
                for _ in 0..ROUND_TRIPS {
                    let mut got = vec![0u8; len];
                    match me {
                        0 => {
                            pause();
                            comm.send(&p2p::fill(0, 1, round, len), 1, 9)?;
                            comm.recv(&mut got, 1, 9)?;
                            p2p::verify(&got, 1, 0, round)?;
                        }
                        1 => {
                            comm.recv(&mut got, 0, 9)?;
                            p2p::verify(&got, 0, 1, round)?;
                            pause();
                            comm.send(&p2p::fill(1, 0, round, len), 0, 9)?;
                        }
                        _ => {}
                    }
                }
                full_by_size.push((len, comm.protocol_stats().full_naps - full_before));
            }
            let s = comm.protocol_stats();
            println!("wakeups naps={} full_naps={}", s.naps, s.full_naps);
            for (len, full) in full_by_size {
                ensure!(
                    5 * full < ROUND_TRIPS || pause_us > 0,
                    "{full} sleeps of {ROUND_TRIPS} round trips of {len} B were never woken: \
                     a lost wake-up"
                );
            }
            "wakeups"
        }
        Scenario::OneSided {
            nodump_mid: Some(rank),
            ..
        } => {
            coll::one_sided_midcall(&comm, rank)?;
            "one-sided"
        }
        Scenario::OneSided { nodump, .. } => {
            if let Some(rank) = nodump {
                // The links (and their probes) and the one-sided state (made by the first
                // barrier) while every rank is dumpable.
                p2p::links_then_nodump(&comm, rank)?;
            }
            coll::one_sided(&comm)?;
            "one-sided"
        }
        Scenario::BigPool { bytes, heap } => {
            coll::big_pool(&comm, bytes, heap)?;
            "big-pool"
        }
        Scenario::InboxUse { traffic } => {
            resources::traffic(&comm, traffic)?;
            let (resident, size) = resources::inbox_use(comm.rank())?;
            resources::handshakes_ended()?;
            let connected = resources::tcp_sockets()?.connected;
            println!("inbox {} of {} kB", resident >> 10, size >> 10);
            println!("tcp {connected} connected");
            // Nobody says goodbye (a frame to every peer) before every rank has measured; a
            // dup, not a barrier, whose algorithm may talk to every rank: the dup's
            // dissemination talks to the peers communicator creation links anyway.
            drop(comm.dup()?);
            "inbox-use"
        }
        Scenario::QuietFinalize { done } => {
            return resources::quiet_finalize(comm, &done).map(|()| println!("OK quiet-finalize"));
        }
        Scenario::Kill { pool, pool_bytes } => {
            comm.barrier()?;
            if comm.rank() == 1 {
                let held = if pool {
                    let b = comm.alloc::<u8>(pool_bytes)?;
                    ensure!(b.in_pool(), "the pool did not serve {pool_bytes} bytes");
                    Some(b)
                } else {
                    None
                };
                // SAFETY: raise has no memory preconditions; SIGKILL ends this process here.
                unsafe { libc::raise(libc::SIGKILL) };
                std::thread::sleep(std::time::Duration::from_secs(10));
                drop(held);
                bail!("SIGKILL did not arrive");
            }
            let mut buf = vec![1.0f32; 1 << 16];
            for i in 0..100_000 {
                comm.allreduce_in_place(&mut buf, ReduceOp::Max)
                    .with_context(|| format!("allreduce {i}"))?;
            }
            "kill"
        }
        Scenario::CollExit => {
            let mut buf = vec![1.0f32; 1 << 18];
            for i in 0..1000 {
                if comm.rank() == 1 && i == 10 {
                    std::process::exit(3);
                }
                comm.allreduce_in_place(&mut buf, ReduceOp::Max)
                    .with_context(|| format!("allreduce {i}"))?;
            }
            "coll-exit"
        }
        Scenario::SplitStop => {
            p2p::split_stop(&comm)?;
            "split-stop"
        }
        Scenario::Exit => {
            // Every rank finishes init before rank 1 exits: otherwise rank 0 could lose rank 1
            // and exit, taking the store it hosts with it, while another rank was still in
            // init (waiting for the store's acknowledgement of its last key), which then
            // could only report the store lost, not rank 1.
            comm.barrier().context("barrier before rank 1 exits")?;
            if comm.rank() == 1 {
                std::process::exit(3);
            }
            let mut buf = [0u8; 1];
            comm.recv(&mut buf, 1, 0).context("waiting for rank 1")?;
            "exit"
        }
    };
    comm.destroy()?;
    println!("OK {name}");
    Ok(())
}

fn main() {
    let args = Args::parse();
    if let Err(e) = run(args.scenario) {
        let rank = std::env::var("HCOMM_RANK").unwrap_or_else(|_| "?".into());
        eprintln!("hcomm_check (rank {rank}): FAILED: {e:#}");
        std::process::exit(1);
    }
}
