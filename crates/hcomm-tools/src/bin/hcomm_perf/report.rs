//! Rank 0's output: the table, the JSON file and the plot.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use hcomm::{Communicator, ProtocolStats};
use hcomm_tools::plot::{self, Curve};
use serde::Serialize;

use super::args::SweepArgs;

/// One line of the results table (and one object of the JSON output).
#[derive(Debug, Clone, Serialize)]
pub(super) struct Row {
    /// Operation name (`pingpong`, `stream`, or the collective as `CollKind::name` says).
    pub(super) collective: &'static str,
    /// Message size in bytes (nccl-tests convention for collectives).
    pub(super) size: u64,
    /// Elements of `type` in `size`.
    pub(super) count: u64,
    /// Element type.
    #[serde(rename = "type")]
    pub(super) dtype: &'static str,
    /// Reduction operation; `None` (printed "-", JSON null) where there is none.
    pub(super) redop: Option<&'static str>,
    /// Root rank; `None` (printed "-", JSON null) where there is none.
    pub(super) root: Option<usize>,
    /// Median time per operation (collectives: of the slowest rank), microseconds.
    pub(super) time_us: f64,
    /// size / time, GB/s.
    pub(super) algbw: f64,
    /// Bus bandwidth, GB/s (nccl-tests' per-collective factor x algbw).
    pub(super) busbw: f64,
    /// Wrong bytes (point-to-point) or elements (collectives) found by the checked
    /// iterations, summed over all ranks.
    pub(super) wrong: u64,
    /// The algorithm that ran (collectives), printed as the last column.
    pub(super) algo: Option<&'static str>,
    /// The row's curve in plots (collectives): the forced algorithm, or "auto".
    pub(super) curve: Option<&'static str>,
}

/// The messages of a run by the transport that carried them (counted at rank 0, over the
/// worlds the run used).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Traffic {
    /// Through shared memory (inline, pulled, pushed).
    shm: u64,
    /// Over TCP (eager, rendezvous).
    tcp: u64,
    /// Through a transport plug-in or libfabric.
    other: u64,
}

impl Traffic {
    /// Adds what `comm`'s world counted.
    pub(super) fn add(&mut self, comm: &Communicator) {
        let s: ProtocolStats = comm.protocol_stats();
        self.shm += s.shm_eager + s.shm_pull + s.shm_push;
        self.tcp += s.tcp_eager + s.tcp_rendezvous;
        self.other += s.plugin_eager + s.plugin_rendezvous + s.ofi_eager + s.ofi_read + s.ofi_write;
    }

    /// The comment line that says how `comm`'s peers were reached and what carried the
    /// messages; the benchmarks read it to check that a run between simulated hosts did not
    /// take shared memory (`bench/common.sh`).
    pub(super) fn line(&self, comm: &Communicator) -> String {
        let peers = (0..comm.size()).filter(|&p| p != comm.rank());
        let shm = peers.clone().filter(|&p| comm.uses_shm(p)).count();
        let tcp = peers
            .clone()
            .filter(|&p| !comm.tcp_rails(p).is_empty())
            .count();
        format!(
            "transport of rank {}: peers through shared memory {shm}, with a TCP connection \
             {tcp}, of {}; messages through shared memory {}, TCP {}, plug-in or libfabric {}",
            comm.rank(),
            peers.count(),
            self.shm,
            self.tcp,
            self.other
        )
    }
}

/// Rank 0's output: the table on stdout as rows arrive, the JSON file and the picture at the
/// end.
pub(super) struct Report {
    rows: Vec<Row>,
    out: io::Stdout,
    /// The JSON file (-J), created before the sweep so that a bad path fails at once.
    json: Option<(PathBuf, BufWriter<File>)>,
    /// The picture (--plot), created before the sweep, and the peers' curves (--peer).
    plot: Option<(PathBuf, File, Vec<Curve>)>,
}

/// Creates `path` for writing, or says which file could not be.
fn create(path: &Path) -> anyhow::Result<File> {
    File::create(path).with_context(|| format!("cannot create {}", path.display()))
}

impl Report {
    pub(super) fn new(sweep: &SweepArgs) -> anyhow::Result<Report> {
        let json = match &sweep.json {
            Some(path) => Some((path.clone(), BufWriter::new(create(path)?))),
            None => None,
        };
        let plot = match &sweep.plot {
            Some(path) => {
                let mut peers = Vec::new();
                for (name, file) in &sweep.peers {
                    let text = std::fs::read_to_string(file).with_context(|| {
                        format!("--peer {name}: cannot read {}", file.display())
                    })?;
                    let curves = plot::read_peer(name, &text)
                        .map_err(|e| anyhow::anyhow!("--peer {name}: {}: {e}", file.display()))?;
                    peers.extend(curves);
                }
                Some((path.clone(), create(path)?, peers))
            }
            None => None,
        };
        Ok(Report {
            rows: Vec::new(),
            out: io::stdout(),
            json,
            plot,
        })
    }

    /// The footer, the JSON file and the picture; `what` describes the run in the picture's
    /// title.
    pub(super) fn finish(&mut self, what: &str) -> anyhow::Result<()> {
        self.footer()?;
        self.write_json()?;
        self.write_plot(what)
    }

    /// Draws the rows, and the peers' curves of the operations measured, into the picture.
    pub(super) fn write_plot(&mut self, what: &str) -> anyhow::Result<()> {
        let Some((path, file, peers)) = &mut self.plot else {
            return Ok(());
        };
        let points = self
            .rows
            .iter()
            .map(|r| (r.collective, r.curve, r.size as f64, r.busbw));
        let mut curves = plot::curves(points, plot::THIS_RUN, false);
        let mut names: Vec<&str> = peers.iter().map(|c| c.source.as_str()).collect();
        names.dedup();
        for name in names {
            let theirs: Vec<&Curve> = peers
                .iter()
                .filter(|c| c.source == name && curves.iter().any(|m| m.collective == c.collective))
                .collect();
            if theirs.is_empty() {
                let has: Vec<&str> = peers
                    .iter()
                    .filter(|c| c.source == name)
                    .map(|c| c.collective.as_str())
                    .collect();
                eprintln!(
                    "hcomm_perf: --peer {name}: no results of the operations measured here \
                     (it has {})",
                    has.join(", ")
                );
            }
            curves.extend(theirs.into_iter().cloned());
        }
        let title = format!("hcomm_perf: bus bandwidth against message size, {what}");
        file.write_all(plot::svg(&title, &curves).as_bytes())
            .and_then(|()| file.flush())
            .with_context(|| format!("cannot write {}", path.display()))
    }

    /// Prints comment lines (each gets a leading "# ").
    pub(super) fn comment(&mut self, text: &str) -> io::Result<()> {
        let mut out = self.out.lock();
        for line in text.lines() {
            writeln!(out, "# {line}")?;
        }
        out.flush()
    }

    /// The column titles; `algo` adds the algorithm column of the collectives.
    pub(super) fn header(&mut self, algo: bool) -> io::Result<()> {
        let mut out = self.out.lock();
        writeln!(out, "#")?;
        let titles = format!(
            "# {:>10} {:>12} {:>7} {:>6} {:>5} {:>11} {:>9} {:>9} {:>7} {}",
            "size",
            "count",
            "type",
            "redop",
            "root",
            "time",
            "algbw",
            "busbw",
            "#wrong",
            if algo { "algo" } else { "" }
        );
        writeln!(out, "{}", titles.trim_end())?;
        let units = format!(
            "# {:>10} {:>12} {:>7} {:>6} {:>5} {:>11} {:>9} {:>9}",
            "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)"
        );
        writeln!(out, "{}", units.trim_end())?;
        out.flush()
    }

    pub(super) fn row(&mut self, row: Row) -> io::Result<()> {
        {
            let mut out = self.out.lock();
            let line = format!(
                "  {:>10} {:>12} {:>7} {:>6} {:>5} {:>11.2} {:>9.3} {:>9.3} {:>7} {}",
                row.size,
                row.count,
                row.dtype,
                row.redop.unwrap_or("-"),
                row.root.map_or_else(|| "-".to_string(), |r| r.to_string()),
                row.time_us,
                row.algbw,
                row.busbw,
                row.wrong,
                row.algo.unwrap_or("")
            );
            writeln!(out, "{}", line.trim_end())?;
            out.flush()?;
        }
        self.rows.push(row);
        Ok(())
    }

    /// The closing lines, as nccl-tests prints them.
    pub(super) fn footer(&mut self) -> io::Result<()> {
        let wrong: u64 = self.rows.iter().map(|r| r.wrong).sum();
        let avg = if self.rows.is_empty() {
            0.0
        } else {
            self.rows.iter().map(|r| r.busbw).sum::<f64>() / self.rows.len() as f64
        };
        let verdict = if wrong == 0 { "OK" } else { "FAILED" };
        self.comment(&format!(
            "Out of bounds values : {wrong} {verdict}\nAvg bus bandwidth    : {avg:.3}\n"
        ))
    }

    /// Writes the rows to the JSON file, if there is one.
    pub(super) fn write_json(&mut self) -> anyhow::Result<()> {
        let Some((path, w)) = &mut self.json else {
            return Ok(());
        };
        serde_json::to_writer_pretty(&mut *w, &self.rows)
            .with_context(|| format!("cannot write {}", path.display()))?;
        writeln!(w)
            .and_then(|()| w.flush())
            .with_context(|| format!("cannot write {}", path.display()))
    }
}
