//! A deterministic in-process simulator of schedules: every rank of a collective in one
//! process, messages through per-pair FIFO channels, with the executor's issue rules.
//!
//! A send completes only when the matching receive has been posted — the rendezvous
//! semantics of large messages — so a schedule that works only while small messages are
//! buffered is caught here, not in a job.
//!
//! It reports what would hang or corrupt a real job: sends and receives that can never all
//! match (deadlock, naming the stuck steps), a receive whose length differs from the matching
//! send, a write that destroys data nothing has read yet, and reads of scratch space never
//! written. Tests compare its results against a sequential reference.

use std::collections::VecDeque;
use std::fmt;

use super::schedule::{Buf, Region, Schedule, Step};
use crate::dtype::{DataType, ReduceOp};
use crate::reduce;

/// What the simulator found wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SimError {
    /// No rank can progress but some have steps left.
    Deadlock(String),
    /// A receive expected a different number of bytes than its matching send carried.
    LengthMismatch(String),
    /// A step overwrote bytes that an earlier step wrote and nothing read since.
    OverlappingWrite(String),
    /// A step read scratch bytes that no step wrote.
    UninitialisedRead(String),
    /// A step names bytes outside its buffer, or a peer outside the communicator.
    OutOfBounds(String),
}

impl fmt::Display for SimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self:?}")
    }
}

/// Messages from one rank to another in send order: (sending step, bytes).
type Channel = VecDeque<(usize, Vec<u8>)>;

/// The buffers of one rank.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct RankBuffers {
    /// Input.
    pub send: Vec<u8>,
    /// Output (and input of in-place calls).
    pub recv: Vec<u8>,
}

struct RankState<'a> {
    sched: &'a Schedule,
    /// The send buffer aliases the receive buffer.
    in_place: bool,
    /// Token regions hold no bytes.
    token: Vec<u8>,
    bufs: RankBuffers,
    scratch: Vec<u8>,
    scratch_written: Vec<bool>,
    /// Per byte of recv/scratch: the step that wrote it and nothing has read since.
    unread_recv: Vec<Option<u32>>,
    unread_scratch: Vec<Option<u32>>,
    done: Vec<bool>,
    next: usize,
    /// Posted receives not yet matched, by source: (step, region).
    posted: Vec<VecDeque<(usize, Region)>>,
}

/// Runs `schedules[r]` for every rank `r` on `inputs[r]`. Where `in_place[r]`, rank r's send
/// buffer aliases its receive buffer.
pub(crate) fn simulate(
    schedules: &[Schedule],
    inputs: Vec<RankBuffers>,
    dtype: DataType,
    op: ReduceOp,
    in_place: &[bool],
) -> Result<Vec<RankBuffers>, SimError> {
    let n = schedules.len();
    let mut ranks: Vec<RankState<'_>> = schedules
        .iter()
        .zip(inputs)
        .enumerate()
        .map(|(r, (sched, bufs))| RankState {
            sched,
            in_place: in_place.get(r).copied().unwrap_or(false),
            token: Vec::new(),
            scratch: vec![0; sched.scratch],
            scratch_written: vec![false; sched.scratch],
            unread_recv: vec![None; bufs.recv.len()],
            unread_scratch: vec![None; sched.scratch],
            bufs,
            done: vec![false; sched.steps.len()],
            next: 0,
            posted: vec![VecDeque::new(); n],
        })
        .collect();
    // channels[src][dst]: messages in send order.
    let mut channels: Vec<Vec<Channel>> = vec![vec![VecDeque::new(); n]; n];
    loop {
        let mut progress = false;
        for (r, st) in ranks.iter_mut().enumerate() {
            progress |= issue(r, st, &mut channels, dtype, op, n)?;
        }
        for dst in 0..n {
            #[allow(clippy::needless_range_loop)] // indexes two tables: channels and posted
            for src in 0..n {
                while let Some(&(step, region)) = ranks[dst].posted[src].front() {
                    let Some((send_step, msg)) = channels[src][dst].pop_front() else {
                        break;
                    };
                    ranks[src].done[send_step] = true;
                    if msg.len() != region.len {
                        return Err(SimError::LengthMismatch(format!(
                            "rank {dst} step {step} expects {} bytes from rank {src}, which sent {}",
                            region.len,
                            msg.len()
                        )));
                    }
                    ranks[dst].posted[src].pop_front();
                    let st = &mut ranks[dst];
                    write_region(st, step, region)?;
                    if region.len > 0 {
                        buf_mut(st, region.buf)[region.range()].copy_from_slice(&msg);
                    }
                    st.done[step] = true;
                    progress = true;
                }
            }
        }
        if ranks.iter().all(|st| st.done.iter().all(|&d| d)) {
            break;
        }
        if !progress {
            let stuck: Vec<String> = ranks
                .iter()
                .enumerate()
                .filter_map(|(r, st)| {
                    let i = st.done.iter().position(|&d| !d)?;
                    Some(format!("rank {r} at step {i} {:?}", st.sched.steps[i]))
                })
                .collect();
            return Err(SimError::Deadlock(stuck.join("; ")));
        }
    }
    Ok(ranks.into_iter().map(|st| st.bufs).collect())
}

fn buf_mut<'s>(st: &'s mut RankState<'_>, buf: Buf) -> &'s mut Vec<u8> {
    match buf {
        Buf::Token => &mut st.token,
        Buf::Send if st.in_place => &mut st.bufs.recv,
        Buf::Send => &mut st.bufs.send,
        Buf::Recv => &mut st.bufs.recv,
        Buf::Scratch => &mut st.scratch,
    }
}

fn read_bytes(st: &mut RankState<'_>, step: usize, r: Region) -> Result<Vec<u8>, SimError> {
    if r.buf == Buf::Token {
        return token(step, r).map(|()| Vec::new());
    }
    let len = buf_mut(st, r.buf).len();
    if r.off + r.len > len {
        return Err(SimError::OutOfBounds(format!(
            "step {step} reads {r:?} of a {len}-byte buffer"
        )));
    }
    let buf = if st.in_place && r.buf == Buf::Send {
        Buf::Recv
    } else {
        r.buf
    };
    match buf {
        Buf::Scratch => {
            if let Some(b) = r.range().find(|&b| !st.scratch_written[b]) {
                return Err(SimError::UninitialisedRead(format!(
                    "step {step} reads scratch byte {b} never written"
                )));
            }
            r.range().for_each(|b| st.unread_scratch[b] = None);
        }
        Buf::Recv => r.range().for_each(|b| st.unread_recv[b] = None),
        Buf::Send | Buf::Token => {}
    }
    Ok(buf_mut(st, r.buf)[r.range()].to_vec())
}

/// Token regions carry no bytes.
fn token(step: usize, r: Region) -> Result<(), SimError> {
    match r.len {
        0 => Ok(()),
        _ => Err(SimError::OutOfBounds(format!(
            "step {step} gives a token region bytes"
        ))),
    }
}

/// Records that `step` writes `r`, checking bounds and unread overwrites.
fn write_region(st: &mut RankState<'_>, step: usize, r: Region) -> Result<(), SimError> {
    if r.buf == Buf::Token {
        return token(step, r);
    }
    let len = buf_mut(st, r.buf).len();
    if r.off + r.len > len {
        return Err(SimError::OutOfBounds(format!(
            "step {step} writes {r:?} of a {len}-byte buffer"
        )));
    }
    let buf = if st.in_place && r.buf == Buf::Send {
        Buf::Recv
    } else {
        r.buf
    };
    let unread = match buf {
        Buf::Token => return Ok(()),
        Buf::Send => {
            return Err(SimError::OutOfBounds(format!(
                "step {step} writes the send buffer"
            )))
        }
        Buf::Recv => &mut st.unread_recv,
        Buf::Scratch => {
            r.range().for_each(|b| st.scratch_written[b] = true);
            &mut st.unread_scratch
        }
    };
    for b in r.range() {
        if let Some(prev) = unread[b] {
            return Err(SimError::OverlappingWrite(format!(
                "step {step} overwrites byte {b} of {buf:?} written by step {prev} and never read"
            )));
        }
        unread[b] = Some(step as u32);
    }
    Ok(())
}

fn issue(
    r: usize,
    st: &mut RankState<'_>,
    channels: &mut [Vec<Channel>],
    dtype: DataType,
    op: ReduceOp,
    n: usize,
) -> Result<bool, SimError> {
    let mut progress = false;
    while st.next < st.sched.steps.len() {
        let i = st.next;
        if !st.sched.deps(i).iter().all(|&d| st.done[d as usize]) {
            break;
        }
        let step = st.sched.steps[i];
        match step {
            Step::Send { peer, src } => {
                if peer >= n {
                    return Err(SimError::OutOfBounds(format!(
                        "rank {r} step {i} sends to rank {peer} of {n}"
                    )));
                }
                let data = read_bytes(st, i, src)?;
                channels[r][peer].push_back((i, data));
            }
            Step::Recv { peer, dst } => {
                if peer >= n {
                    return Err(SimError::OutOfBounds(format!(
                        "rank {r} step {i} receives from rank {peer} of {n}"
                    )));
                }
                st.posted[peer].push_back((i, dst));
            }
            Step::Copy { dst, src } => {
                let data = read_bytes(st, i, src)?;
                write_region(st, i, dst)?;
                buf_mut(st, dst.buf)[dst.range()].copy_from_slice(&data);
                st.done[i] = true;
            }
            Step::Reduce { dst, src } => {
                let operand = read_bytes(st, i, src)?;
                let mut acc = read_bytes(st, i, dst)?;
                reduce::reduce_into(dtype, op, &mut acc, &operand)
                    .map_err(|e| SimError::OutOfBounds(format!("rank {r} step {i}: {e}")))?;
                write_region(st, i, dst)?;
                buf_mut(st, dst.buf)[dst.range()].copy_from_slice(&acc);
                st.done[i] = true;
            }
        }
        st.next += 1;
        progress = true;
    }
    Ok(progress)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coll::schedule::ScheduleBuilder;

    fn reg(buf: Buf, off: usize, len: usize) -> Region {
        Region::new(buf, off, len)
    }

    fn inputs(n: usize, len: usize) -> Vec<RankBuffers> {
        (0..n)
            .map(|r| RankBuffers {
                send: vec![r as u8 + 1; len],
                recv: vec![0; len],
            })
            .collect()
    }

    #[test]
    fn exchange_and_reduce() {
        let scheds: Vec<Schedule> = (0..2)
            .map(|r| {
                let mut b = ScheduleBuilder::new();
                b.copy(reg(Buf::Recv, 0, 4), reg(Buf::Send, 0, 4))
                    .send(1 - r, reg(Buf::Send, 0, 4))
                    .recv(1 - r, reg(Buf::Scratch, 0, 4))
                    .reduce(reg(Buf::Recv, 0, 4), reg(Buf::Scratch, 0, 4));
                b.build()
            })
            .collect();
        let out = simulate(&scheds, inputs(2, 4), DataType::Uint8, ReduceOp::Sum, &[]).unwrap();
        assert_eq!(out[0].recv, vec![3; 4]);
        assert_eq!(out[1].recv, vec![3; 4]);
    }

    #[test]
    fn reports_deadlock() {
        // Both ranks receive first: real blocking receives would hang.
        let scheds: Vec<Schedule> = (0..2)
            .map(|r| {
                let mut b = ScheduleBuilder::new();
                b.recv(1 - r, reg(Buf::Recv, 0, 4))
                    .send(1 - r, reg(Buf::Recv, 0, 4));
                b.build()
            })
            .collect();
        let e = simulate(&scheds, inputs(2, 4), DataType::Uint8, ReduceOp::Sum, &[]).unwrap_err();
        assert!(matches!(e, SimError::Deadlock(_)), "{e}");
    }

    #[test]
    fn reports_length_mismatch_and_lost_writes() {
        let mut a = ScheduleBuilder::new();
        a.send(1, reg(Buf::Send, 0, 4));
        let mut b = ScheduleBuilder::new();
        b.recv(0, reg(Buf::Recv, 0, 2));
        let e = simulate(
            &[a.build(), b.build()],
            inputs(2, 4),
            DataType::Uint8,
            ReduceOp::Sum,
            &[],
        )
        .unwrap_err();
        assert!(matches!(e, SimError::LengthMismatch(_)), "{e}");

        let mut a = ScheduleBuilder::new();
        a.send(1, reg(Buf::Send, 0, 4))
            .send(1, reg(Buf::Send, 0, 4));
        let mut b = ScheduleBuilder::new();
        b.recv(0, reg(Buf::Recv, 0, 4))
            .recv(0, reg(Buf::Recv, 0, 4));
        let e = simulate(
            &[a.build(), b.build()],
            inputs(2, 4),
            DataType::Uint8,
            ReduceOp::Sum,
            &[],
        )
        .unwrap_err();
        assert!(matches!(e, SimError::OverlappingWrite(_)), "{e}");
    }

    #[test]
    fn reports_unreceived_sends_and_uninitialised_reads() {
        let mut a = ScheduleBuilder::new();
        a.send(1, reg(Buf::Send, 0, 4));
        let e = simulate(
            &[a.build(), Schedule::default()],
            inputs(2, 4),
            DataType::Uint8,
            ReduceOp::Sum,
            &[],
        )
        .unwrap_err();
        // A send completes only when received: one never received never completes.
        assert!(matches!(e, SimError::Deadlock(_)), "{e}");

        let mut a = ScheduleBuilder::new();
        a.copy(reg(Buf::Recv, 0, 4), reg(Buf::Scratch, 0, 4));
        let e = simulate(
            &[a.build()],
            inputs(1, 4),
            DataType::Uint8,
            ReduceOp::Sum,
            &[],
        )
        .unwrap_err();
        assert!(matches!(e, SimError::UninitialisedRead(_)), "{e}");
    }
}
