//! Reproducible calls for checks: the shapes of a call on every rank, with the uneven layouts of
//! the v-collectives drawn from a seed. The simulator tests of the algorithms and
//! `hcomm_check` draw their calls here.

use std::sync::Arc;

use crate::coll::{CollKind, Shape, VLayout};
use crate::dtype::{DataType, ReduceOp};
use crate::rng::Rng;

/// Displacements of blocks of `counts` elements placed in order, each after a random gap of 0
/// or 1 element.
fn v_displs(counts: &[usize], rng: &mut Rng) -> Vec<usize> {
    let mut at = 0;
    counts
        .iter()
        .map(|c| {
            at += rng.below(2);
            let d = at;
            at += c;
            d
        })
        .collect()
}

/// Counts and displacements of a v-collective's buffer of `n` blocks: random counts in
/// `0..=max` (some zero), placed by [`v_displs`].
fn v_layout(n: usize, max: usize, rng: &mut Rng) -> (Vec<usize>, Vec<usize>) {
    let counts: Vec<usize> = (0..n).map(|_| rng.below(max + 1)).collect();
    let displs = v_displs(&counts, rng);
    (counts, displs)
}

/// The element counts of an all-to-all-v among `n` ranks: `matrix[p][q]`, in `0..=max`, is
/// what rank p sends to rank q.
fn v_matrix(n: usize, max: usize, rng: &mut Rng) -> Vec<Vec<usize>> {
    (0..n)
        .map(|_| (0..n).map(|_| rng.below(max + 1)).collect())
        .collect()
}

/// Every rank's shape of a call of `kind`, for checks: the v-collectives get uneven layouts
/// drawn from `seed` ([`Rng`]), the same on every rank that asks with the same arguments.
#[allow(clippy::too_many_arguments)]
pub fn shapes(
    kind: CollKind,
    n: usize,
    count: usize,
    root: usize,
    dtype: DataType,
    op: ReduceOp,
    in_place: bool,
    seed: u64,
) -> Vec<Shape> {
    let mut g = Rng::new(seed);
    let base = Shape {
        in_place,
        ..Shape::new(kind, dtype, op, count, root, n)
    };
    match kind {
        CollKind::AllGatherV => {
            let (recv_counts, recv_displs) = v_layout(n, count, &mut g);
            let v = Arc::new(VLayout {
                recv_counts,
                recv_displs,
                ..VLayout::default()
            });
            vec![Shape { v: Some(v), ..base }; n]
        }
        CollKind::AllToAllV => {
            let matrix = v_matrix(n, count, &mut g);
            (0..n)
                .map(|r| {
                    let send_counts = matrix[r].clone();
                    let recv_counts: Vec<usize> = (0..n).map(|p| matrix[p][r]).collect();
                    let send_displs = v_displs(&send_counts, &mut g);
                    let recv_displs = v_displs(&recv_counts, &mut g);
                    let v = VLayout {
                        send_counts,
                        send_displs,
                        recv_counts,
                        recv_displs,
                    };
                    Shape {
                        v: Some(Arc::new(v)),
                        in_place: false,
                        ..base.clone()
                    }
                })
                .collect()
        }
        _ => vec![base; n],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v_layouts_place_blocks_in_order_without_overlap() {
        let mut rng = Rng::new(5);
        for n in 1..9 {
            let (counts, displs) = v_layout(n, 7, &mut rng);
            assert_eq!((counts.len(), displs.len()), (n, n));
            assert!(counts.iter().all(|&c| c <= 7));
            for i in 1..n {
                assert!(
                    displs[i] >= displs[i - 1] + counts[i - 1],
                    "{counts:?} {displs:?}"
                );
                assert!(
                    displs[i] <= displs[i - 1] + counts[i - 1] + 1,
                    "{counts:?} {displs:?}"
                );
            }
            let m = v_matrix(n, 3, &mut rng);
            assert!(
                m.len() == n
                    && m.iter()
                        .all(|row| row.len() == n && row.iter().all(|&c| c <= 3))
            );
        }
    }
}
