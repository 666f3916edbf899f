//! Chrome traces (`HCOMM_TRACE=path`): every operation of the rank as a complete event
//! (`"ph": "X"`, start and duration in µs), kept in memory and written as JSON when the
//! process's last world closes; Perfetto and `chrome://tracing` load the file.
//!
//! Each rank writes its own file: `%r` in the path is replaced by the rank; a path without
//! it gets `.rank<N>` before a final `.json`, or `.rank<N>.json` appended. Timestamps are
//! microseconds of the host's monotonic clock, so the files of one host's ranks line up when
//! merged. When the variable is unset, an operation costs one relaxed load of a flag.
//!
//! Both ends of an event are readings of that clock itself ([`monotonic_ns`]), never an
//! `Instant` converted through a pair of readings taken one after the other: the pair is
//! microseconds apart when the second reading is the process's first (the vDSO is looked up
//! then) or the thread is preempted between them, which shifted a whole rank's trace against
//! the others'.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use super::clock::monotonic_ns;
use super::stats::{proto, unpack_name, OpInfo};
use crate::error::{Error, Result};
use crate::sync::lock;

/// Events kept at most (about 100 MB); later ones are counted, not kept.
const MAX_EVENTS: usize = 1 << 20;

static ENABLED: AtomicBool = AtomicBool::new(false);
static SINK: Mutex<Option<Sink>> = Mutex::new(None);

struct Sink {
    path: String,
    rank: usize,
    events: Vec<Event>,
    dropped: u64,
}

struct Event {
    info: OpInfo,
    peer: Option<usize>,
    tid: u64,
    start_us: f64,
    dur_us: f64,
}

/// Whether operations are traced.
#[inline]
pub(crate) fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// The file of rank `rank` for `HCOMM_TRACE=path`.
pub(crate) fn rank_path(path: &str, rank: usize) -> String {
    if path.contains("%r") {
        path.replace("%r", &rank.to_string())
    } else if let Some(stem) = path.strip_suffix(".json") {
        format!("{stem}.rank{rank}.json")
    } else {
        format!("{path}.rank{rank}.json")
    }
}

/// Starts tracing into `path` (as `HCOMM_TRACE` gives it) as rank `rank`, unless the process
/// already traces.
pub(crate) fn start(path: &str, rank: usize) {
    let mut sink = lock(&SINK);
    if sink.is_none() {
        *sink = Some(Sink {
            path: rank_path(path, rank),
            rank,
            events: Vec::new(),
            dropped: 0,
        });
        ENABLED.store(true, Ordering::Relaxed);
    }
}

thread_local! {
    /// A small number per thread, the trace's `tid`.
    static TID: u64 = {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        NEXT.fetch_add(1, Ordering::Relaxed)
    };
}

/// Records an operation that started at `start_ns` ([`monotonic_ns`]) and ends now.
pub(crate) fn record(start_ns: u64, info: &OpInfo, peer: Option<usize>) {
    let end_ns = monotonic_ns();
    let tid = TID.try_with(|t| *t).unwrap_or(0);
    let mut sink = lock(&SINK);
    let Some(s) = sink.as_mut() else { return };
    if s.events.len() >= MAX_EVENTS {
        s.dropped += 1;
        return;
    }
    let ev = Event {
        info: *info,
        peer,
        tid,
        start_us: start_ns as f64 / 1e3,
        dur_us: end_ns.saturating_sub(start_ns) as f64 / 1e3,
    };
    s.events.push(ev);
}

/// Writes the trace, if the process traces, and stops tracing.
pub(crate) fn finish() {
    let Some(sink) = lock(&SINK).take() else {
        return;
    };
    ENABLED.store(false, Ordering::Relaxed);
    match write(&sink) {
        Ok(()) => tracing::info!("trace of {} operations in {}", sink.events.len(), sink.path),
        Err(e) => tracing::warn!("{e}"),
    }
}

fn write(s: &Sink) -> Result<()> {
    let json = render(s);
    std::fs::write(&s.path, json).map_err(|e| {
        Error::invalid_argument(format!(
            "HCOMM_TRACE: cannot write the trace {}: {e}",
            s.path
        ))
        .with_source(e)
    })
}

/// The Chrome trace JSON of a sink.
fn render(s: &Sink) -> String {
    let mut out = String::with_capacity(128 + s.events.len() * 200);
    out.push_str("{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n");
    let _ = write!(
        out,
        "{{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":{r},\"tid\":0,\"args\":{{\"name\":\
         \"rank {r}\",\"dropped_events\":{d}}}}}",
        r = s.rank,
        d = s.dropped
    );
    for e in &s.events {
        let i = &e.info;
        let protocols: Vec<&str> = (0..proto::NAMES.len())
            .filter(|b| i.protocols & (1 << b) != 0)
            .map(|b| proto::NAMES[b])
            .collect();
        let _ = write!(
            out,
            ",\n{{\"name\":\"{}\",\"cat\":\"{}\",\"ph\":\"X\",\"pid\":{},\"tid\":{},\
             \"ts\":{:.3},\"dur\":{:.3},\"args\":{{\"seq\":{},\"bytes\":{},\"ranks\":{},\
             \"algorithm\":\"{}\",\"protocols\":\"{}\"",
            i.kind.name(),
            if i.kind.is_collective() {
                "collective"
            } else {
                "p2p"
            },
            s.rank,
            e.tid,
            e.start_us,
            e.dur_us,
            i.seq,
            i.bytes,
            i.comm_size,
            unpack_name(i.algo),
            protocols.join(",")
        );
        if let Some(p) = e.peer {
            let _ = write!(out, ",\"peer\":{p}");
        }
        out.push_str("}}");
    }
    out.push_str("\n]}\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::stats::pack_name;
    use crate::observe::OpKind;

    #[test]
    fn paths_per_rank() {
        assert_eq!(rank_path("/tmp/t-%r.json", 3), "/tmp/t-3.json");
        assert_eq!(rank_path("/tmp/t.json", 3), "/tmp/t.rank3.json");
        assert_eq!(rank_path("/tmp/t", 0), "/tmp/t.rank0.json");
    }

    #[test]
    fn rendered_events_are_complete_events() {
        let info = OpInfo {
            kind: OpKind::AllReduce,
            seq: 4,
            bytes: 32,
            comm_size: 2,
            algo: pack_name("ring"),
            protocols: proto::SHM_INLINE | proto::TCP_EAGER,
            steps: 2,
        };
        let sink = Sink {
            path: String::new(),
            rank: 1,
            events: vec![Event {
                info,
                peer: Some(0),
                tid: 2,
                start_us: 1.5,
                dur_us: 2.25,
            }],
            dropped: 0,
        };
        let json = render(&sink);
        assert!(json.starts_with("{\"displayTimeUnit\""));
        assert!(json.contains(
            "{\"name\":\"allreduce\",\"cat\":\"collective\",\"ph\":\"X\",\"pid\":1,\"tid\":2,\
             \"ts\":1.500,\"dur\":2.250,\"args\":{\"seq\":4,\"bytes\":32,\"ranks\":2,\
             \"algorithm\":\"ring\",\"protocols\":\"shm-inline,tcp-eager\",\"peer\":0}}"
        ));
        assert!(json.trim_end().ends_with("]}"));
    }
}
