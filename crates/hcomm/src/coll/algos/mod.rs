//! The algorithms, and the registry the selector and `HCOMM_ALGO` choose from.

pub(crate) mod bruck;
pub(crate) mod direct;
pub(crate) mod dissemination;
pub(crate) mod halving_doubling;
pub(crate) mod hier;
pub(crate) mod onesided;
pub(crate) mod pairwise;
pub(crate) mod ring;
pub(crate) mod tree;

use super::{Algorithm, CollKind};

/// Every algorithm, in no particular order.
pub(crate) fn all() -> &'static [&'static dyn Algorithm] {
    static ALL: [&dyn Algorithm; 11] = [
        &direct::Direct,
        &ring::Ring,
        &halving_doubling::Rabenseifner,
        &halving_doubling::RecursiveDoubling,
        &tree::Tree,
        &tree::DoubleBinaryTree,
        &bruck::Bruck,
        &pairwise::Pairwise,
        &dissemination::Dissemination,
        &hier::Hierarchical,
        &onesided::OneSided,
    ];
    &ALL
}

/// The algorithm called `name` that implements `kind`.
pub(crate) fn by_name(kind: CollKind, name: &str) -> Option<&'static dyn Algorithm> {
    all()
        .iter()
        .copied()
        .find(|a| a.name() == name && a.supports(kind))
}

/// Names of the algorithms that implement `kind`.
pub fn names_for(kind: CollKind) -> Vec<&'static str> {
    all()
        .iter()
        .filter(|a| a.supports(kind))
        .map(|a| a.name())
        .collect()
}

/// Splits `count` elements of `elem` bytes into `n` nearly equal segments (the first
/// `count % n` one element longer): (byte offset, byte length) of each.
pub(crate) fn segments(count: usize, n: usize, elem: usize) -> Vec<(usize, usize)> {
    let (q, r) = (count / n, count % n);
    let mut out = Vec::with_capacity(n);
    let mut at = 0;
    for i in 0..n {
        let c = q + usize::from(i < r);
        out.push((at * elem, c * elem));
        at += c;
    }
    out
}

#[cfg(test)]
pub(crate) mod testing;
