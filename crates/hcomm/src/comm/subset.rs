//! Communicators over a chosen list of ranks, made without any message: for front ends, such
//! as the torch.distributed backend, whose groups are formed by only their members.

use super::{Communicator, COLL, INTERNAL, WORLD_ID};
use crate::error::{Error, Result};
use crate::rng::mix;

/// Keeps the ids of subsets apart from those `split` and `dup` draw.
const SUBSET_DOMAIN: u64 = 0x5375_6273_6574_0001;

impl Communicator {
    /// A communicator of `ranks` (ranks of this communicator, in the new order; this rank
    /// among them), made locally: no rank waits for another. Every member must pass the same
    /// `ranks` and the same `tag`, and a tag must not be used twice for different rank
    /// lists on this communicator: the tag names the new communicator's messages.
    ///
    /// Errors: [`Error::InvalidArgument`] when `ranks` is empty, repeats a rank, names one
    /// out of range or leaves this rank out.
    pub fn subset(&self, ranks: &[usize], tag: u64) -> Result<Communicator> {
        let size = self.size();
        let mut seen = vec![false; size];
        for &r in ranks {
            if r >= size || std::mem::replace(&mut seen[r], true) {
                return Err(Error::invalid_argument(format!(
                    "subset: ranks {ranks:?} repeat a rank or name one outside 0..{size}"
                )));
            }
        }
        let rank = ranks.iter().position(|&r| r == self.rank).ok_or_else(|| {
            Error::invalid_argument(format!(
                "subset: rank {} is not among the ranks {ranks:?}",
                self.rank
            ))
        })?;
        let mut h = mix(self.id ^ mix(tag ^ SUBSET_DOMAIN));
        for &r in ranks {
            h = mix(h ^ r as u64);
        }
        let id = (h & !(INTERNAL | COLL)).max(WORLD_ID + 1);
        Ok(self.derive(id, ranks.to_vec(), rank))
    }
}
