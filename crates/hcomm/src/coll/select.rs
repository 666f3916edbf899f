//! Choosing an algorithm: `HCOMM_ALGO` overrides, deterministic mode, else the cost model.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use super::algos;
use super::{Algorithm, CollKind, CostModel, Shape};
use crate::error::{Error, Result};
use crate::topology::Topology;

/// The algorithm of deterministic mode for reducing collectives (fixed rank order).
const DETERMINISTIC: &str = "direct";

/// Picks the algorithm of each call and counts the choices.
pub struct Selector {
    overrides: HashMap<CollKind, &'static dyn Algorithm>,
    deterministic: bool,
    model: CostModel,
    /// Calls per (collective, algorithm): slot `kind index * algorithms + algorithm index`.
    counts: Vec<AtomicU64>,
}

impl std::fmt::Debug for Selector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let o: Vec<String> = self
            .overrides
            .iter()
            .map(|(k, a)| format!("{}:{}", k.name(), a.name()))
            .collect();
        f.debug_struct("Selector")
            .field("overrides", &o)
            .field("deterministic", &self.deterministic)
            .finish()
    }
}

impl Selector {
    /// Parses `HCOMM_ALGO` (`allreduce:ring,broadcast:tree`); an unknown collective or
    /// algorithm is an error listing the valid names.
    pub fn new(algo: Option<&str>, deterministic: bool) -> Result<Selector> {
        let mut overrides = HashMap::new();
        for item in algo
            .unwrap_or("")
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
        {
            let (coll, name) = item.split_once(':').ok_or_else(|| {
                Error::invalid_argument(format!(
                    "HCOMM_ALGO entry {item:?} is not collective:algorithm (e.g. allreduce:ring)"
                ))
            })?;
            let kind = CollKind::from_name(coll.trim()).ok_or_else(|| {
                let valid: Vec<&str> = CollKind::ALL.iter().map(|k| k.name()).collect();
                Error::invalid_argument(format!(
                    "HCOMM_ALGO names an unknown collective {coll:?}; valid: {}",
                    valid.join(", ")
                ))
            })?;
            let alg = algos::by_name(kind, name.trim()).ok_or_else(|| {
                Error::invalid_argument(format!(
                    "HCOMM_ALGO: {:?} is not an algorithm of {}; valid: {}",
                    name.trim(),
                    kind.name(),
                    algos::names_for(kind).join(", ")
                ))
            })?;
            overrides.insert(kind, alg);
        }
        let slots = CollKind::ALL.len() * algos::all().len();
        let counts = (0..slots).map(|_| AtomicU64::new(0)).collect();
        Ok(Selector {
            overrides,
            deterministic,
            model: CostModel::TCP,
            counts,
        })
    }

    /// The algorithm for `shape` on `topo`.
    pub(crate) fn choose(&self, shape: &Shape, topo: &Topology) -> &'static dyn Algorithm {
        // Two ranks combine two values; IEEE arithmetic (and the kernels' NaN handling) is
        // commutative, so every algorithm gives the rank-order result bit for bit.
        let chosen = if self.deterministic && shape.kind.reduces() && shape.size > 2 {
            algos::by_name(shape.kind, DETERMINISTIC)
        } else if let Some(a) = self.overrides.get(&shape.kind) {
            Some(*a)
        } else {
            algos::all()
                .iter()
                .filter(|a| a.supports(shape.kind))
                .filter_map(|a| a.cost(shape, topo, &self.model).map(|c| (c, *a)))
                .min_by(|x, y| x.0.total_cmp(&y.0))
                .map(|(_, a)| a)
        };
        let alg = chosen
            .or_else(|| algos::by_name(shape.kind, DETERMINISTIC))
            .expect("the direct algorithm implements every collective");
        tracing::debug!(
            collective = shape.kind.name(),
            bytes = shape.count * shape.elem(),
            ranks = shape.size,
            algorithm = alg.name(),
            "algorithm chosen"
        );
        alg
    }

    /// The algorithm `HCOMM_ALGO` names for `kind`, if any.
    pub fn forced(&self, kind: CollKind) -> Option<&'static dyn Algorithm> {
        self.overrides.get(&kind).copied()
    }

    /// The counter slot of `alg` running `kind` (give it to [`Selector::count`]).
    pub(crate) fn slot(&self, kind: CollKind, alg: &'static dyn Algorithm) -> usize {
        let k = CollKind::ALL.iter().position(|&c| c == kind).unwrap_or(0);
        let a = algos::all()
            .iter()
            .position(|x| x.name() == alg.name())
            .unwrap_or(0);
        k * algos::all().len() + a
    }

    /// Counts one call in `slot`.
    pub(crate) fn count(&self, slot: usize) {
        if let Some(c) = self.counts.get(slot) {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Calls so far per (collective, algorithm), those with calls only.
    pub(crate) fn counts(&self) -> Vec<(CollKind, &'static str, u64)> {
        let all = algos::all();
        self.counts
            .iter()
            .enumerate()
            .filter_map(|(i, c)| {
                let n = c.load(Ordering::Relaxed);
                (n > 0).then(|| (CollKind::ALL[i / all.len()], all[i % all.len()].name(), n))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overrides_parse_and_bad_names_list_the_valid_ones() {
        let s = Selector::new(Some("allreduce:direct, broadcast:direct"), false).unwrap();
        assert_eq!(s.overrides.len(), 2);
        let e = Selector::new(Some("allreduce:warp"), false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("direct") && e.contains("warp"), "{e}");
        let e = Selector::new(Some("allsmash:direct"), false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("allreduce") && e.contains("allsmash"), "{e}");
        let e = Selector::new(Some("allreduce"), false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("collective:algorithm"), "{e}");
    }
}
