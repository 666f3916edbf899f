//! Test data every rank can regenerate: pseudo-random byte streams per (sending rank, size,
//! iteration, message), so that misplaced, stale, duplicated or foreign data all show up, a
//! checksum of a buffer.

pub use hcomm::internal::rng::mix;

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

#[cfg(test)]
mod tests {
    use super::*;

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
