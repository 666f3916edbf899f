//! Test data every rank can regenerate: pseudo-random byte streams per (sending rank, size,
//! iteration, message), so that misplaced, stale, duplicated or foreign data all show up, a
//! checksum of a buffer, the seeded generator of every test and tool ([`Rng`]) and the uneven
//! layouts of the v-collectives drawn from it ([`v_layout`], [`v_matrix`]).

/// A 64-bit bijective mixing function (splitmix64's finalizer after a constant step).
pub fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The seed of the message `msg` that `rank` sends at checked iteration `iter`.
pub fn seed(rank: usize, size: usize, iter: u64, msg: usize) -> u64 {
    [rank as u64, size as u64, iter, msg as u64]
        .iter()
        .fold(0x6863_6f6d_6d5f_7066, |s, &v| mix(s ^ v))
}

/// The 8 pattern bytes at word `w` of the stream `seed`.
fn word(seed: u64, w: usize) -> [u8; 8] {
    mix(seed ^ (w as u64).wrapping_mul(0xd134_2543_de82_ef95)).to_le_bytes()
}

/// Fills `buf` with the pattern `seed`.
pub fn fill(buf: &mut [u8], seed: u64) {
    fill_with(buf, seed, 0);
}

/// Fills `buf` with the bitwise complement of the pattern `seed`.
pub fn fill_complement(buf: &mut [u8], seed: u64) {
    fill_with(buf, seed, 0xff);
}

fn fill_with(buf: &mut [u8], seed: u64, xor: u8) {
    for (w, chunk) in buf.chunks_mut(8).enumerate() {
        let expect = word(seed, w);
        for (b, e) in chunk.iter_mut().zip(expect) {
            *b = e ^ xor;
        }
    }
}

/// Number of bytes of `buf` that differ from the pattern `seed`.
pub fn count_wrong(buf: &[u8], seed: u64) -> u64 {
    let mut wrong = 0u64;
    for (w, chunk) in buf.chunks(8).enumerate() {
        let expect = word(seed, w);
        if chunk != &expect[..chunk.len()] {
            wrong += chunk.iter().zip(expect).filter(|(b, e)| *b != e).count() as u64;
        }
    }
    wrong
}

/// A 64-bit checksum of `bytes` and their length.
///
/// Each 8-byte word is folded into the state through [`mix`], a bijection: two inputs of one
/// length that differ in a single word (any number of flipped bits in it) always have different
/// checksums, and wider damage goes unnoticed with odds of about 2^-64. Not a defence against
/// someone forging data, which the job secret's authentication is for.
pub fn checksum(bytes: &[u8]) -> u64 {
    let mut h = mix(0x6863_6f6d_6d5f_6373 ^ bytes.len() as u64);
    for chunk in bytes.chunks(8) {
        let mut w = [0u8; 8];
        w[..chunk.len()].copy_from_slice(chunk);
        h = mix(h ^ u64::from_le_bytes(w));
    }
    h
}

/// A small, fast, reproducible random generator (SplitMix64).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// The generator that starts at `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let z = mix(self.0);
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z
    }

    /// A number in `0..n`; 0 when `n` is 0.
    pub fn below(&mut self, n: usize) -> usize {
        ((self.next_u64() as u128 * n as u128) >> 64) as usize
    }

    /// True with probability 1 / `n`.
    pub fn one_in(&mut self, n: usize) -> bool {
        self.below(n) == 0
    }

    /// A length in `0..=max`, small ones much more often than large ones.
    pub fn len(&mut self, max: usize) -> usize {
        let cap = self.below(max + 1);
        self.below(cap + 1)
    }

    /// One of `items`.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    /// Fills `buf` with random bytes.
    pub fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let bytes = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&bytes[..chunk.len()]);
        }
    }
}

/// Displacements of blocks of `counts` elements placed in order, each after a random gap of 0
/// or 1 element.
pub fn v_displs(counts: &[usize], rng: &mut Rng) -> Vec<usize> {
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
pub fn v_layout(n: usize, max: usize, rng: &mut Rng) -> (Vec<usize>, Vec<usize>) {
    let counts: Vec<usize> = (0..n).map(|_| rng.below(max + 1)).collect();
    let displs = v_displs(&counts, rng);
    (counts, displs)
}

/// The element counts of an all-to-all-v among `n` ranks: `matrix[p][q]`, in `0..=max`, is
/// what rank p sends to rank q.
pub fn v_matrix(n: usize, max: usize, rng: &mut Rng) -> Vec<Vec<usize>> {
    (0..n)
        .map(|_| (0..n).map(|_| rng.below(max + 1)).collect())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rng_is_splitmix64() {
        // The first outputs of SplitMix64 from seed 0.
        let mut rng = Rng::new(0);
        assert_eq!(rng.next_u64(), 0xe220_a839_7b1d_cdaf);
        assert_eq!(rng.next_u64(), 0x6e78_9e6a_a1b9_65f4);
    }

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

    #[test]
    fn pattern_detects_every_wrong_byte() {
        let seed = seed(0, 13, 0, 0);
        let mut buf = vec![0u8; 13];
        fill(&mut buf, seed);
        assert_eq!(count_wrong(&buf, seed), 0);
        buf[3] ^= 1;
        buf[12] ^= 0x80;
        assert_eq!(count_wrong(&buf, seed), 2);
        fill_complement(&mut buf, seed);
        assert_eq!(count_wrong(&buf, seed), 13);
        // Different rank, size, iteration or message give different data.
        let other = [
            super::seed(1, 13, 0, 0),
            super::seed(0, 14, 0, 0),
            super::seed(0, 13, 1, 0),
            super::seed(0, 13, 0, 1),
        ];
        fill(&mut buf, seed);
        for s in other {
            assert!(count_wrong(&buf, s) > 0);
        }
    }

    #[test]
    fn checksum_catches_every_single_byte_change_and_the_length() {
        let mut buf = vec![0u8; 77];
        fill(&mut buf, seed(2, 77, 0, 0));
        let sum = checksum(&buf);
        assert_eq!(sum, checksum(&buf.clone()));
        for i in 0..buf.len() {
            for bit in [0x01, 0x80, 0xff] {
                buf[i] ^= bit;
                assert_ne!(checksum(&buf), sum, "byte {i} ^ {bit:#x}");
                buf[i] ^= bit;
            }
        }
        assert_ne!(checksum(&buf[..76]), sum);
        // Zero padding of the last word does not hide a length change.
        assert_ne!(checksum(&[0u8; 3]), checksum(&[0u8; 4]));
        assert_ne!(checksum(&[]), checksum(&[0u8]));
    }
}
