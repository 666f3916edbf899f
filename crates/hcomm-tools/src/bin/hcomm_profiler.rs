//! `hcomm_profiler`: shows what a running rank (or every rank of its job) does, live.
//!
//! It maps the rank's statistics segment (`hcomm::internal::observe::stats`) and reads it; the rank is
//! neither stopped nor signalled. Attaching sets the segment's `timing` flag, from which on the
//! rank times its operations (two TSC reads each): operations before the first attach are
//! counted, not timed.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail};
use clap::Parser;
use hcomm::internal::observe::clock::{self, TickKind};
use hcomm::internal::observe::stats::{
    self, proto, unpack_name, FailoverCount, FlightSnapshot, OfiStats, StatsLayout, StatsReader,
    LANES, OFI_PROTOCOLS,
};
use hcomm::internal::observe::{OpKind, OP_KINDS};

/// Show a running hcomm rank's operations live: per kind of operation the count, bytes, total
/// and recent time, algorithm, protocols and transports; pool hits and misses; messages per
/// protocol; failovers by peer and rail (TCP streams given up, fallbacks from the transport
/// plug-in to TCP); the libfabric transport's provider, frames and bytes per protocol and
/// memory registrations (cache hits, misses, invalidations; pool blocks registered and the
/// transfers that used them); and every operation in flight with how long it has waited and on
/// which peer.
///
/// Times cover the operations since a profiler first attached to the rank (the rank then
/// starts timing them); counts and bytes cover everything.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// Process id of a rank (any process with an hcomm world open).
    #[arg(long)]
    pid: u32,
    /// Print one snapshot (after --interval, for the rates) and exit.
    #[arg(long)]
    once: bool,
    /// Every rank of the job PID belongs to (on this host).
    #[arg(long)]
    job: bool,
    /// Milliseconds between refreshes (and the window of the rates).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(10..=3_600_000))]
    interval: u64,
}

/// One attached rank.
struct Target {
    reader: StatsReader,
    /// Ticks per second of the rank's clock.
    tick_hz: f64,
    /// Counts at the previous refresh, for the rates.
    last_counts: [u64; OP_KINDS],
}

/// What a lane sum gives for one kind of operation.
#[derive(Default)]
struct KindTotals {
    count: u64,
    bytes: u64,
    timed: u64,
    total_ticks: u64,
    recent_ticks: u64,
    last_end: u64,
    protocols: u64,
    algo: String,
}

fn main() {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => {}
        Err(e) => {
            eprintln!("hcomm_profiler: {e:#}");
            std::process::exit(1);
        }
    }
}

fn run(args: &Args) -> anyhow::Result<()> {
    let first = StatsReader::open_pid(args.pid)
        .map_err(|e| match alive(args.pid) {
            true => anyhow!("cannot read the statistics of process {}: {e}", args.pid),
            false => anyhow!("no process {}", args.pid),
        })?
        .ok_or_else(|| not_hcomm(args.pid))?;
    let readers = if args.job {
        let job = first.job_id();
        let mut readers = vec![first];
        for pid in stats::find_job(&job)? {
            if pid != args.pid {
                // A rank may exit while we look: take those that are still there.
                if let Ok(Some(r)) = StatsReader::open_pid(pid) {
                    readers.push(r);
                }
            }
        }
        readers.sort_by_key(|r| r.layout().header.rank);
        readers
    } else {
        vec![first]
    };
    let mut targets: Vec<Target> = readers
        .into_iter()
        .map(|reader| Target {
            tick_hz: 0.0,
            reader,
            last_counts: [0; OP_KINDS],
        })
        .collect();
    for t in &mut targets {
        t.reader.watch();
        t.tick_hz = tick_rate(t.reader.layout())?;
        t.last_counts = totals(t.reader.layout()).map(|k| k.count);
    }
    let interval = Duration::from_millis(args.interval);
    if args.once {
        std::thread::sleep(interval);
        print!("{}", render(&mut targets, interval));
        return Ok(());
    }
    let stop = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGINT, Arc::clone(&stop))?;
    signal_hook::flag::register(signal_hook::consts::SIGTERM, Arc::clone(&stop))?;
    let mut last = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(interval);
        let window = last.elapsed();
        last = Instant::now();
        // Home, then clear the screen: one redraw per refresh, no scrolling.
        println!(
            "\x1b[H\x1b[2J{}(every {} ms; Ctrl-C to quit)",
            render(&mut targets, window),
            args.interval
        );
        if !targets.iter().any(|t| alive(t.reader.layout().header.pid)) {
            println!("the watched processes have exited");
            break;
        }
    }
    Ok(())
}

/// The error for a process without statistics.
fn not_hcomm(pid: u32) -> anyhow::Error {
    anyhow!(
        "process {pid} is not an hcomm rank: it has no hcomm statistics open (no hcomm world, or \
         an hcomm without them)"
    )
}

fn alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// Ticks per second of the rank's clock: the TSC's rate measured against the monotonic clock
/// since the segment was made (at least 50 ms of it).
fn tick_rate(layout: &StatsLayout) -> anyhow::Result<f64> {
    let h = &layout.header;
    if h.tick_kind == TickKind::MonotonicNs as u32 {
        return Ok(1e9);
    }
    if h.tick_kind != clock::TICK_KIND as u32 {
        bail!(
            "the rank counts time in units this profiler cannot read (kind {})",
            h.tick_kind
        );
    }
    let since = |now_ns: u64| now_ns.saturating_sub(h.created_ns);
    let wait = Duration::from_nanos(50_000_000u64.saturating_sub(since(clock::monotonic_ns())));
    std::thread::sleep(wait);
    let (ticks, ns) = (clock::ticks(), clock::monotonic_ns());
    Ok(ticks.saturating_sub(h.created_ticks) as f64 / since(ns).max(1) as f64 * 1e9)
}

/// Every lane summed, per kind of operation.
fn totals(layout: &StatsLayout) -> [KindTotals; OP_KINDS] {
    let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
    std::array::from_fn(|k| {
        let mut t = KindTotals::default();
        let mut newest_count = 0;
        for lane in &layout.lanes[..LANES] {
            let s = &lane.kinds[k];
            let count = load(&s.count);
            t.count += count;
            t.bytes += load(&s.bytes);
            t.timed += load(&s.timed);
            t.total_ticks += load(&s.total_ticks);
            t.protocols |= load(&s.protocols);
            let end = load(&s.last_end);
            // The recent time and the algorithm of the lane that ran this kind last (or
            // most, when nothing was timed).
            if end > t.last_end || (t.last_end == 0 && count > newest_count) {
                t.last_end = end;
                newest_count = count;
                t.recent_ticks = load(&s.recent_ticks);
                t.algo = unpack_name([load(&s.algo[0]), load(&s.algo[1]), load(&s.algo[2])]);
            }
        }
        t
    })
}

fn bits(mask: u64, names: &[&str]) -> String {
    let mut out: Vec<&str> = Vec::new();
    for (b, n) in names.iter().enumerate() {
        if mask & (1 << b) != 0 && !out.contains(n) {
            out.push(n);
        }
    }
    if out.is_empty() {
        "-".into()
    } else {
        out.join(",")
    }
}

fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// The snapshot of every target, with rates over `window`.
fn render(targets: &mut [Target], window: Duration) -> String {
    let mut out = String::new();
    for t in targets {
        render_one(&mut out, t, window);
    }
    out
}

fn render_one(out: &mut String, t: &mut Target, window: Duration) {
    let layout = t.reader.layout();
    let h = &layout.header;
    let job: String = h
        .job_id
        .iter()
        .take_while(|&&b| b != 0)
        .map(|&b| char::from(b))
        .collect();
    let state = if alive(h.pid) { "" } else { " (exited)" };
    let _ = writeln!(
        out,
        "rank {} of {}, pid {}{state}, job {job} ({})",
        h.rank,
        h.size,
        h.pid,
        t.reader.path()
    );
    let _ = writeln!(
        out,
        "  {:<15} {:>10} {:>9} {:>11} {:>10} {:>11} {:>11}  {:<19} {:<26} transport",
        "operation",
        "count",
        "rate/s",
        "bytes",
        "time(s)",
        "avg(us)",
        "recent(us)",
        "algorithm",
        "protocol"
    );
    let sums = totals(layout);
    let us = |ticks: u64| ticks as f64 / t.tick_hz * 1e6;
    for (k, s) in sums.iter().enumerate() {
        if s.count == 0 {
            continue;
        }
        let Some(kind) = OpKind::from_index(k) else {
            continue;
        };
        let rate = s.count.saturating_sub(t.last_counts[k]) as f64 / window.as_secs_f64();
        t.last_counts[k] = s.count;
        let (total, avg, recent) = if s.timed == 0 {
            ("-".into(), "-".into(), "-".into())
        } else {
            (
                format!("{:.3}", us(s.total_ticks) / 1e6),
                format!("{:.2}", us(s.total_ticks) / s.timed as f64),
                format!("{:.2}", us(s.recent_ticks)),
            )
        };
        let _ = writeln!(
            out,
            "  {:<15} {:>10} {:>9.0} {:>11} {:>10} {:>11} {:>11}  {:<19} {:<26} {}",
            kind.name(),
            s.count,
            rate,
            human_bytes(s.bytes),
            total,
            avg,
            recent,
            if s.algo.is_empty() { "-" } else { &s.algo },
            bits(s.protocols, &proto::NAMES),
            bits(s.protocols, &proto::TRANSPORTS),
        );
    }
    let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let messages: Vec<String> = h
        .messages
        .iter()
        .enumerate()
        .filter(|(_, c)| load(c) > 0)
        .map(|(b, c)| format!("{} {}", proto::NAMES[b], load(c)))
        .collect();
    let _ = writeln!(
        out,
        "  pool: {} hits, {} misses; messages: {}",
        load(&h.pool_hits),
        load(&h.pool_misses),
        if messages.is_empty() {
            "none".into()
        } else {
            messages.join(", ")
        }
    );
    let failovers: Vec<FailoverCount> = h.failovers.iter().filter_map(|f| f.read()).collect();
    if failovers.is_empty() {
        let _ = writeln!(out, "  failovers: none");
    }
    for f in &failovers {
        let _ = writeln!(out, "  {}", describe_failover(f));
    }
    if let Some(line) = describe_ofi(&h.ofi) {
        let _ = writeln!(out, "  {line}");
    }
    let now = clock::ticks();
    let flights: Vec<FlightSnapshot> = layout
        .lanes
        .iter()
        .filter_map(|l| FlightSnapshot::read(&l.flight))
        .collect();
    if flights.is_empty() {
        let _ = writeln!(out, "  in flight: none");
    }
    for f in flights {
        let _ = writeln!(out, "  in flight: {}", describe_flight(&f, now, t.tick_hz));
    }
}

/// One row of failovers: the peer, the rail and how many times.
fn describe_failover(f: &FailoverCount) -> String {
    if f.plugin {
        format!(
            "fallback: world rank {}: transport plug-in -> TCP (rail {}): {}",
            f.peer, f.rail, f.count
        )
    } else {
        format!(
            "failover: world rank {}: rail {} given up: {}",
            f.peer, f.rail, f.count
        )
    }
}

/// The libfabric line: provider, frames and bytes per protocol (eager, RDMA read, RDMA write,
/// direct collective steps), registrations; `None` without libfabric.
fn describe_ofi(o: &OfiStats) -> Option<String> {
    let provider = o.provider();
    if provider.is_empty() {
        return None;
    }
    let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let protocols: Vec<String> = OFI_PROTOCOLS
        .iter()
        .zip(o.messages.iter().zip(&o.bytes))
        .map(|(name, (m, b))| format!("{name} {} ({})", load(m), human_bytes(load(b))))
        .collect();
    Some(format!(
        "libfabric {provider}: {}; registrations: {} hits, {} misses, {} invalidations; pool \
         blocks registered {}, pool transfers {}",
        protocols.join(", "),
        load(&o.mr_hits),
        load(&o.mr_misses),
        load(&o.mr_invalidations),
        load(&o.pool_blocks),
        load(&o.mr_pool),
    ))
}

/// One operation in flight, with how long it has run and waited.
fn describe_flight(f: &FlightSnapshot, now: u64, tick_hz: f64) -> String {
    let secs = |since: u64| now.saturating_sub(since) as f64 / tick_hz;
    let mut s = match f.kind.is_collective() {
        true => format!(
            "{} #{} ({} B, {} ranks",
            f.kind.name(),
            f.seq,
            f.bytes,
            f.comm_size
        ),
        false => format!("{} tag {} ({} B", f.kind.name(), f.seq, f.bytes),
    };
    if !f.algo.is_empty() {
        let _ = write!(s, ", {}", f.algo);
    }
    if let Some(step) = f.step.filter(|_| f.steps > 0) {
        let _ = write!(s, ", step {}/{}", step + 1, f.steps);
    }
    s.push(')');
    if f.started != 0 {
        let _ = write!(s, ", running {:.3} s", secs(f.started));
    }
    match (f.waiting_since, f.peer) {
        (0, _) => s.push_str(", not blocked"),
        (since, Some(p)) => {
            let _ = write!(s, ", waiting {:.3} s on rank {p}", secs(since));
        }
        (since, None) => {
            let _ = write!(s, ", waiting {:.3} s", secs(since));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protocol_bits_name_their_transports_once() {
        let m = proto::SHM_INLINE | proto::SHM_PULL | proto::TCP_EAGER;
        assert_eq!(bits(m, &proto::NAMES), "shm-inline,shm-pull,tcp-eager");
        assert_eq!(bits(m, &proto::TRANSPORTS), "shm,tcp");
        assert_eq!(bits(0, &proto::NAMES), "-");
    }

    #[test]
    fn the_libfabric_line_shows_each_protocol_and_the_registrations() {
        let o = OfiStats::default();
        assert_eq!(describe_ofi(&o), None);
        for (w, v) in o.provider.iter().zip(stats::pack_name::<4>("tcp;ofi_rxm")) {
            w.store(v, Ordering::Relaxed);
        }
        o.messages[1].store(3, Ordering::Relaxed);
        o.bytes[1].store(3 << 20, Ordering::Relaxed);
        o.mr_misses.store(2, Ordering::Relaxed);
        o.messages[3].store(5, Ordering::Relaxed);
        o.bytes[3].store(5 << 10, Ordering::Relaxed);
        assert_eq!(
            describe_ofi(&o).unwrap(),
            "libfabric tcp;ofi_rxm: eager 0 (0 B), rdma-read 3 (3.0 MiB), rdma-write 0 (0 B), \
             direct 5 (5.0 KiB); registrations: 0 hits, 2 misses, 0 invalidations; pool blocks registered 0, pool \
             transfers 0"
        );
    }

    #[test]
    fn failovers_name_the_peer_the_rail_and_the_kind() {
        let mut f = FailoverCount {
            peer: 1,
            plugin: false,
            rail: "10.0.0.1 -> 10.0.0.2".into(),
            count: 2,
        };
        assert_eq!(
            describe_failover(&f),
            "failover: world rank 1: rail 10.0.0.1 -> 10.0.0.2 given up: 2"
        );
        f.plugin = true;
        assert_eq!(
            describe_failover(&f),
            "fallback: world rank 1: transport plug-in -> TCP (rail 10.0.0.1 -> 10.0.0.2): 2"
        );
    }
}
