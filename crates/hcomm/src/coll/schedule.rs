//! Schedules: what one rank does in a collective, as a list of steps over byte regions.
//!
//! An algorithm writes each rank's part of a collective as a sequential program of steps
//! (send, receive, reduce, copy) over regions of three buffers: the caller's send buffer, the
//! caller's receive buffer, and scratch space the executor provides. [`ScheduleBuilder`]
//! derives from the regions which earlier steps each step depends on (read-after-write,
//! write-after-read, write-after-write), so the executor can run independent steps at once
//! — several transfers in flight, a reduction overlapping the next transfer — while the
//! result stays that of the sequential program.
//!
//! Communication steps are issued in program order, so the n-th send from A to B always
//! matches the n-th receive at B from A: algorithms must list them in the same order on both
//! sides (the simulator checks this).

use std::ops::Range;

/// Which buffer of a collective call a region lies in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Buf {
    /// The caller's input (read-only). In-place calls alias it to `Recv`.
    Send,
    /// The caller's output.
    Recv,
    /// Temporary space owned by the executor.
    Scratch,
    /// No memory: empty regions that order steps moving no data (a barrier's rounds). Two
    /// token regions overlap when their offsets are equal.
    Token,
}

/// A byte range in one buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Region {
    /// The buffer.
    pub buf: Buf,
    /// First byte.
    pub off: usize,
    /// Number of bytes.
    pub len: usize,
}

impl Region {
    /// `len` bytes at `off` of `buf`.
    pub fn new(buf: Buf, off: usize, len: usize) -> Region {
        Region { buf, off, len }
    }

    /// The byte range.
    pub fn range(&self) -> Range<usize> {
        self.off..self.off + self.len
    }

    /// Whether the two regions share a byte (aliasing of Send and Recv is the caller's
    /// concern: in-place schedules never read `Send`). Tokens overlap by offset.
    pub fn overlaps(&self, other: &Region) -> bool {
        if self.buf == Buf::Token || other.buf == Buf::Token {
            return self.buf == other.buf && self.off == other.off;
        }
        self.buf == other.buf
            && self.len > 0
            && other.len > 0
            && self.off < other.off + other.len
            && other.off < self.off + self.len
    }
}

/// One action of one rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Send the bytes of `src` to `peer` (a rank of the communicator).
    Send {
        /// Destination rank.
        peer: usize,
        /// What to send.
        src: Region,
    },
    /// Receive exactly `dst.len` bytes from `peer` into `dst`.
    Recv {
        /// Source rank.
        peer: usize,
        /// Where the bytes go.
        dst: Region,
    },
    /// `dst = dst (op) src`, elementwise in the call's data type.
    Reduce {
        /// Accumulator.
        dst: Region,
        /// Operand.
        src: Region,
    },
    /// `dst = src`.
    Copy {
        /// Destination.
        dst: Region,
        /// Source.
        src: Region,
    },
}

impl Step {
    /// Regions the step reads.
    pub fn reads(&self) -> [Option<Region>; 2] {
        match *self {
            Step::Send { src, .. } => [Some(src), None],
            Step::Recv { .. } => [None, None],
            Step::Reduce { dst, src } => [Some(dst), Some(src)],
            Step::Copy { src, .. } => [Some(src), None],
        }
    }

    /// The region the step writes.
    pub fn writes(&self) -> Option<Region> {
        match *self {
            Step::Send { .. } => None,
            Step::Recv { dst, .. } | Step::Reduce { dst, .. } | Step::Copy { dst, .. } => Some(dst),
        }
    }

    /// Whether the step moves data between ranks.
    pub fn is_comm(&self) -> bool {
        matches!(self, Step::Send { .. } | Step::Recv { .. })
    }
}

/// One rank's part of a collective, with the dependencies of every step.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Schedule {
    /// The steps in program order.
    pub steps: Vec<Step>,
    /// `deps[dep_start[i]..dep_start[i + 1]]` are the earlier steps step `i` waits for.
    dep_start: Vec<u32>,
    deps: Vec<u32>,
    /// Bytes of scratch space the steps use.
    pub scratch: usize,
}

impl Schedule {
    /// The earlier steps that must finish before step `i` starts.
    pub fn deps(&self, i: usize) -> &[u32] {
        &self.deps[self.dep_start[i] as usize..self.dep_start[i + 1] as usize]
    }

    /// Number of communication steps (for statistics).
    pub fn comm_steps(&self) -> usize {
        self.steps.iter().filter(|s| s.is_comm()).count()
    }
}

/// Builds a [`Schedule`] step by step, deriving dependencies from the regions.
#[derive(Debug, Default)]
pub(crate) struct ScheduleBuilder {
    steps: Vec<Step>,
    scratch: usize,
}

impl ScheduleBuilder {
    /// An empty schedule.
    pub(crate) fn new() -> ScheduleBuilder {
        ScheduleBuilder::default()
    }

    /// Appends a step; zero-length transfers and copies are kept for matching but cost
    /// nothing, zero-length local steps are dropped.
    pub(crate) fn push(&mut self, step: Step) -> &mut ScheduleBuilder {
        for r in step.reads().into_iter().flatten().chain(step.writes()) {
            if r.buf == Buf::Scratch {
                self.scratch = self.scratch.max(r.off + r.len);
            }
        }
        match step {
            Step::Reduce { dst, .. } | Step::Copy { dst, .. } if dst.len == 0 => {}
            Step::Copy { dst, src } if dst == src => {}
            _ => self.steps.push(step),
        }
        self
    }

    /// Sends `src` to `peer`.
    pub(crate) fn send(&mut self, peer: usize, src: Region) -> &mut ScheduleBuilder {
        self.push(Step::Send { peer, src })
    }

    /// Receives from `peer` into `dst`.
    pub(crate) fn recv(&mut self, peer: usize, dst: Region) -> &mut ScheduleBuilder {
        self.push(Step::Recv { peer, dst })
    }

    /// `dst = dst (op) src`.
    pub(crate) fn reduce(&mut self, dst: Region, src: Region) -> &mut ScheduleBuilder {
        self.push(Step::Reduce { dst, src })
    }

    /// `dst = src`.
    pub(crate) fn copy(&mut self, dst: Region, src: Region) -> &mut ScheduleBuilder {
        self.push(Step::Copy { dst, src })
    }

    /// Finishes: computes every step's dependencies.
    pub(crate) fn build(self) -> Schedule {
        let ScheduleBuilder { steps, scratch } = self;
        let mut dep_start = Vec::with_capacity(steps.len() + 1);
        let mut deps = Vec::new();
        // Per buffer, the earlier accesses still relevant: (step, region, is_write).
        let mut history: Vec<(u32, Region, bool)> = Vec::new();
        for (i, step) in steps.iter().enumerate() {
            dep_start.push(deps.len() as u32);
            let reads = step.reads();
            let write = step.writes();
            let mut mine: Vec<u32> = history
                .iter()
                .filter(|&&(_, r, was_write)| {
                    let raw = was_write && reads.iter().flatten().any(|x| x.overlaps(&r));
                    raw || write.is_some_and(|w| w.overlaps(&r))
                })
                .map(|&(j, _, _)| j)
                .collect();
            mine.sort_unstable();
            mine.dedup();
            deps.extend_from_slice(&mine);
            // Keep history small: a write fully covering an earlier access supersedes it
            // for later steps (they depend on this write, which depends on that access).
            if let Some(w) = write {
                history.retain(|&(_, r, _)| {
                    !(r.buf == w.buf && r.off >= w.off && r.off + r.len <= w.off + w.len)
                });
            }
            for r in reads.iter().flatten() {
                history.push((i as u32, *r, false));
            }
            if let Some(w) = write {
                history.push((i as u32, w, true));
            }
        }
        dep_start.push(deps.len() as u32);
        Schedule {
            steps,
            dep_start,
            deps,
            scratch,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(buf: Buf, off: usize, len: usize) -> Region {
        Region::new(buf, off, len)
    }

    #[test]
    fn dependencies_follow_the_data() {
        let mut b = ScheduleBuilder::new();
        b.copy(r(Buf::Recv, 0, 8), r(Buf::Send, 0, 8)) // 0
            .send(1, r(Buf::Recv, 0, 4)) // 1: reads what 0 wrote
            .recv(1, r(Buf::Scratch, 0, 4)) // 2: independent
            .reduce(r(Buf::Recv, 4, 4), r(Buf::Scratch, 0, 4)) // 3: after 0 and 2
            .recv(1, r(Buf::Recv, 0, 4)); // 4: overwrites what 1 reads
        let s = b.build();
        assert_eq!(s.deps(0), &[] as &[u32]);
        assert_eq!(s.deps(1), &[0]);
        assert_eq!(s.deps(2), &[] as &[u32]);
        assert_eq!(s.deps(3), &[0, 2]);
        assert_eq!(s.deps(4), &[0, 1]);
        assert_eq!(s.scratch, 4);
        assert_eq!(s.comm_steps(), 3);
    }

    #[test]
    fn empty_local_steps_are_dropped() {
        let mut b = ScheduleBuilder::new();
        b.copy(r(Buf::Recv, 0, 0), r(Buf::Send, 0, 0))
            .send(1, r(Buf::Send, 0, 0));
        b.copy(r(Buf::Recv, 3, 5), r(Buf::Recv, 3, 5));
        let s = b.build();
        assert_eq!(s.steps.len(), 1);
    }
}
