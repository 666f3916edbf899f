//! The sequential reference of every collective: what each rank's receive buffer must hold.
//!
//! Reductions fold the ranks' inputs in rank order with the scalar kernels; `avg` divides the
//! sum by the number of ranks at the end, as the collectives do.

use super::{CollKind, Shape};
use crate::dtype::ReduceOp;
use crate::reduce::scalar;

/// The receive buffers every rank must end with. `shapes[r]` is rank r's view of the call
/// (they differ only in all-to-all-v), `sends[r]` its send buffer and `recvs[r]` its receive
/// buffer before the call (for in-place calls the input; bytes a call does not write keep
/// their value).
pub fn expected(shapes: &[Shape], sends: &[Vec<u8>], recvs: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let n = shapes.len();
    let s = &shapes[0];
    let e = s.elem();
    let block = s.count * e;
    let input = |r: usize| -> &[u8] {
        if shapes[r].in_place_at(r) {
            &recvs[r]
        } else {
            &sends[r]
        }
    };
    let mut out: Vec<Vec<u8>> = recvs.to_vec();
    let reduce_all = |range: std::ops::Range<usize>| -> Vec<u8> {
        let mut acc = input(0)[range.clone()].to_vec();
        for r in 1..n {
            // Lengths are equal by construction, so the kernel cannot fail.
            let _ = scalar::reduce_into(s.dtype, s.op, &mut acc, &input(r)[range.clone()]);
        }
        if s.op == ReduceOp::Avg {
            let _ = scalar::finish_avg(s.dtype, &mut acc, n);
        }
        acc
    };
    match s.kind {
        CollKind::AllReduce => {
            let sum = reduce_all(0..block);
            out.iter_mut().for_each(|o| o.copy_from_slice(&sum));
        }
        CollKind::Reduce => out[s.root] = reduce_all(0..block),
        CollKind::ReduceScatter => {
            for (r, o) in out.iter_mut().enumerate() {
                // In place, the input is the whole n-block buffer and the result its block r.
                let res = reduce_all(r * block..(r + 1) * block);
                if shapes[r].in_place {
                    o[r * block..(r + 1) * block].copy_from_slice(&res);
                } else {
                    o.copy_from_slice(&res);
                }
            }
        }
        CollKind::Broadcast => {
            let data = recvs[s.root].clone();
            out.iter_mut().for_each(|o| o.copy_from_slice(&data));
        }
        CollKind::AllGather => {
            for o in out.iter_mut() {
                for (r, chunk) in o.chunks_mut(block.max(1)).enumerate().take(n) {
                    if shapes[r].in_place {
                        chunk.copy_from_slice(&recvs[r][r * block..(r + 1) * block]);
                    } else {
                        chunk.copy_from_slice(&sends[r][..block]);
                    }
                }
            }
        }
        CollKind::Gather => {
            let root = s.root;
            for r in 0..n {
                let src = if shapes[r].in_place_at(r) && r == root {
                    recvs[root][r * block..(r + 1) * block].to_vec()
                } else {
                    sends[r][..block].to_vec()
                };
                out[root][r * block..(r + 1) * block].copy_from_slice(&src);
            }
        }
        CollKind::Scatter => {
            for (r, o) in out.iter_mut().enumerate() {
                let src = if shapes[s.root].in_place_at(s.root) {
                    &recvs[s.root]
                } else {
                    &sends[s.root]
                };
                let part = &src[r * block..(r + 1) * block];
                if shapes[r].in_place_at(r) && r == s.root {
                    continue;
                }
                o.copy_from_slice(part);
            }
        }
        CollKind::AllToAll => {
            for (r, o) in out.iter_mut().enumerate() {
                for p in 0..n {
                    o[p * block..(p + 1) * block]
                        .copy_from_slice(&input(p)[r * block..(r + 1) * block]);
                }
            }
        }
        CollKind::AllGatherV => {
            let v = s.v.as_ref().expect("allgatherv has counts");
            for o in out.iter_mut() {
                for p in 0..n {
                    let (c, d) = (v.recv_counts[p] * e, v.recv_displs[p] * e);
                    let src: &[u8] = if shapes[p].in_place {
                        &recvs[p][d..d + c]
                    } else {
                        &sends[p][..c]
                    };
                    o[d..d + c].copy_from_slice(src);
                }
            }
        }
        CollKind::AllToAllV => {
            for (r, o) in out.iter_mut().enumerate() {
                let vr = shapes[r].v.as_ref().expect("alltoallv has counts");
                for (p, sp) in shapes.iter().enumerate() {
                    let vp = sp.v.as_ref().expect("alltoallv has counts");
                    let (c, sd) = (vp.send_counts[r] * e, vp.send_displs[r] * e);
                    let rd = vr.recv_displs[p] * e;
                    o[rd..rd + c].copy_from_slice(&sends[p][sd..sd + c]);
                }
            }
        }
        CollKind::Barrier => {}
    }
    out
}
