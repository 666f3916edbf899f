//! `hcomm_trace DIR`: merges the flight recorder dumps of a job (one `rank<N>.json` per rank,
//! written on timeout, abort, SIGUSR1 or `dump_trace`) and says, per communicator, which
//! collective call is stuck and which members never entered it, and which calls the ranks
//! made differently (another collective, type, count or root at the same sequence number).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::Parser;
use hcomm::internal::observe::flight::{CommDump, Dump, OpRecord, FORMAT, VERSION};

#[derive(Parser)]
#[command(
    about = "Merge a job's flight recorder dumps (HCOMM_TRACE_DIR) and diagnose stuck and \
             mismatched collective calls"
)]
struct Args {
    /// The directory of the dumps (HCOMM_TRACE_DIR; /tmp/hcomm-trace by default).
    dir: PathBuf,
    /// Also list every rank's last calls of each communicator.
    #[arg(long)]
    verbose: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("hcomm_trace: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// Reads every dump of `dir`.
fn read_dumps(dir: &Path) -> Result<Vec<(PathBuf, Dump)>> {
    let mut out = Vec::new();
    let entries =
        std::fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))?;
    for entry in entries {
        let path = entry?.path();
        if path.extension().is_none_or(|e| e != "json") {
            continue;
        }
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        let value: serde_json::Value = match serde_json::from_str(&text) {
            Ok(v) => v,
            Err(e) => {
                eprintln!("hcomm_trace: skipping {}: not JSON ({e})", path.display());
                continue;
            }
        };
        if value.get("format").and_then(|f| f.as_str()) != Some(FORMAT) {
            continue;
        }
        let version = value.get("version").and_then(serde_json::Value::as_u64);
        if version != Some(u64::from(VERSION)) {
            bail!(
                "{} is version {version:?} of the dump format; this hcomm_trace reads version \
                 {VERSION}",
                path.display()
            );
        }
        let dump: Dump = serde_json::from_value(value)
            .with_context(|| format!("{} is not a valid dump", path.display()))?;
        out.push((path, dump));
    }
    Ok(out)
}

/// What one rank recorded of one communicator.
struct Seen<'a> {
    world: usize,
    comm: &'a CommDump,
}

/// A call as ranks must agree on it.
fn call_of(op: &OpRecord) -> String {
    let root = op.root.map_or(String::new(), |r| format!(" root {r}"));
    format!("{} {} x{}{root}", op.op, op.dtype, op.count)
}

/// "rank 1" or "rank 1 (world rank 3)".
fn who(rank: usize, world: usize) -> String {
    if rank == world {
        format!("rank {rank}")
    } else {
        format!("rank {rank} (world rank {world})")
    }
}

fn run(args: &Args) -> Result<()> {
    let dumps = read_dumps(&args.dir)?;
    if dumps.is_empty() {
        bail!(
            "no flight recorder dump ({FORMAT}) in {}",
            args.dir.display()
        );
    }
    // Several jobs may have written into one directory: take the one that wrote last.
    let newest = dumps
        .iter()
        .max_by_key(|(_, d)| d.dumped_unix_ns)
        .map(|(_, d)| d.job.clone())
        .unwrap_or_default();
    let others = dumps.iter().filter(|(_, d)| d.job != newest).count();
    let dumps: Vec<&Dump> = dumps
        .iter()
        .filter(|(_, d)| d.job == newest)
        .map(|(_, d)| d)
        .collect();
    let size = dumps.iter().map(|d| d.size).max().unwrap_or(0);
    let ranks: BTreeSet<usize> = dumps.iter().map(|d| d.rank).collect();
    println!(
        "job {}: dumps of world ranks {:?} of {size}{}",
        &newest[..newest.len().min(12)],
        ranks,
        if others > 0 {
            format!(" ({others} dumps of other jobs ignored)")
        } else {
            String::new()
        }
    );
    for d in &dumps {
        println!(
            "  rank {}: {} on {} (pid {})",
            d.rank, d.reason, d.host, d.pid
        );
    }
    // Every communicator (and epoch) any rank recorded.
    let mut comms: BTreeMap<(u64, String), Vec<Seen<'_>>> = BTreeMap::new();
    for d in &dumps {
        for c in &d.communicators {
            comms
                .entry((c.epoch, c.comm.clone()))
                .or_default()
                .push(Seen {
                    world: d.rank,
                    comm: c,
                });
        }
    }
    let mut findings = 0;
    for ((epoch, id), seen) in &comms {
        findings += communicator(id, *epoch, seen, args.verbose);
    }
    if findings == 0 {
        println!("no stuck call and no mismatched call found");
    }
    Ok(())
}

/// Diagnoses one communicator from what its members recorded; returns how many findings it
/// printed.
fn communicator(id: &str, epoch: u64, seen: &[Seen<'_>], verbose: bool) -> usize {
    let members = seen
        .iter()
        .map(|s| &s.comm.members)
        .max_by_key(|m| m.len())
        .cloned()
        .unwrap_or_default();
    let name = if epoch == 0 {
        format!("comm {id}")
    } else {
        format!("comm {id} epoch {epoch}")
    };
    // By rank in the communicator.
    let by_rank: BTreeMap<usize, &Seen<'_>> = seen.iter().map(|s| (s.comm.rank, s)).collect();
    let missing: Vec<usize> = (0..members.len())
        .filter(|r| !by_rank.contains_key(r))
        .collect();
    let mut findings = 0;
    // Per sequence number, each rank's record.
    let mut calls: BTreeMap<u64, BTreeMap<usize, &OpRecord>> = BTreeMap::new();
    for (&r, s) in &by_rank {
        for op in &s.comm.ops {
            if let Some(seq) = op.seq {
                calls.entry(seq).or_default().insert(r, op);
            }
        }
    }
    // Mismatched calls: one sequence number, different calls.
    for (seq, recs) in &calls {
        let mut kinds: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        for (&r, op) in recs {
            kinds.entry(call_of(op)).or_default().push(r);
        }
        if kinds.len() > 1 {
            findings += 1;
            let parts: Vec<String> = kinds
                .iter()
                .map(|(call, rs)| format!("{call} on ranks {rs:?}"))
                .collect();
            println!("{name}, seq {seq}: mismatched calls: {}", parts.join("; "));
        }
    }
    // The stuck call: the first one some rank made but did not complete.
    let stuck = calls
        .iter()
        .find(|(_, recs)| recs.values().any(|op| op.state != "completed"));
    if let Some((&seq, recs)) = stuck {
        let op = recs.values().next().map_or("?", |o| o.op.as_str());
        let never: Vec<usize> = by_rank
            .iter()
            .filter(|(_, s)| s.comm.entered <= seq)
            .map(|(&r, _)| r)
            .collect();
        for &r in &never {
            findings += 1;
            let s = by_rank[&r];
            let last = last_completed(s.comm).map_or("it completed none".to_string(), |l| {
                format!("its last completed seq is {l}")
            });
            println!(
                "{name}, seq {seq}, {op}: {} never entered; {last}",
                who(r, s.world)
            );
        }
        for (&r, op) in recs {
            if op.state != "completed" {
                let s = by_rank[&r];
                let peer = op
                    .peer
                    .map_or(String::new(), |p| format!(", waiting for rank {p}"));
                let error = op
                    .error
                    .as_deref()
                    .map_or(String::new(), |e| format!(": {e}"));
                println!(
                    "{name}, seq {seq}, {op_name}: {} {}{peer}{error}",
                    who(r, s.world),
                    op.state,
                    op_name = op.op
                );
            }
        }
        if never.is_empty() && !missing.is_empty() {
            findings += 1;
            println!(
                "{name}, seq {seq}, {op}: not completed; no dump from ranks {missing:?} (send \
                 them SIGUSR1, or see the others' errors above)"
            );
        } else if !missing.is_empty() {
            println!("{name}: no dump from ranks {missing:?}");
        }
    }
    if verbose {
        for (&r, s) in &by_rank {
            println!(
                "{name}: {}: entered {}, recorded {} (kept {})",
                who(r, s.world),
                s.comm.entered,
                s.comm.recorded,
                s.comm.ops.len()
            );
            for op in s.comm.ops.iter().rev().take(5).rev() {
                let seq = op.seq.map_or("-".to_string(), |q| q.to_string());
                println!("    seq {seq}: {} {}", call_of(op), op.state);
            }
        }
    }
    findings
}

/// The highest sequence number a rank completed on a communicator.
fn last_completed(c: &CommDump) -> Option<u64> {
    c.ops
        .iter()
        .filter(|o| o.state == "completed")
        .filter_map(|o| o.seq)
        .max()
}
