//! The frame header of hcomm's stream transports, and its validation.
//!
//! Every frame on a TCP stream starts with a fixed 64-byte little-endian header. Decoding
//! checks everything a peer controls (magic, version, kind, flags, reserved bits and every
//! length) before any buffer is chosen or allocated, so a corrupt or hostile stream is
//! detected at the first bad header.

/// Bytes of an encoded header.
pub(crate) const HEADER_LEN: usize = 64;
/// "HCM1" little-endian.
pub(crate) const MAGIC: u32 = u32::from_le_bytes(*b"HCM1");
/// Wire version spoken by this build.
pub(crate) const VERSION: u8 = 1;
/// Largest payload of an eager frame a receiver accepts (the sender's limit is configurable
/// up to this).
pub(crate) const MAX_EAGER: u64 = 16 << 20;
/// Largest payload of one data chunk a receiver accepts.
pub(crate) const MAX_CHUNK: u64 = 64 << 20;
/// Largest message a rendezvous may announce (256 TiB).
pub(crate) const MAX_MESSAGE: u64 = 1 << 48;

/// `Cts` flag: the receiver's buffer is too small; the sender must not send the data.
pub(crate) const FLAG_DISCARD: u16 = 1;
/// `Abort` flag: the sender abandoned the operation because ranks called mismatched
/// operations (not because of another error).
pub(crate) const FLAG_MISMATCH: u16 = 2;
/// Words of a shared-memory fast box message's body ([`FrameHeader::encode_fast`]).
pub(crate) const FAST_WORDS: usize = 7;
/// Largest payload of an `Eager` frame without a signature that travels in a fast box.
pub(crate) const FAST_PAYLOAD: usize = 32;
/// Largest payload of an `Eager` frame with a signature that travels in a fast box.
pub(crate) const FAST_PAYLOAD_SIG: usize = 16;
/// `Rts` flag (shared memory): the receiver may copy the data itself, with cross-memory
/// attach, from the sender's buffer at address `offset`.
pub(crate) const FLAG_CAN_PULL: u16 = 4;
/// `Cts` flag: the receiver copied the data itself; the sender's part is done.
pub(crate) const FLAG_PULLED: u16 = 8;
/// `Cts` flag (shared memory): the receiver pulls the data and asks the sender to write
/// pieces of it too, with cross-memory attach, into its buffer at address `offset`: pieces of
/// `comm` bytes, claimed in the pair's split slot under generation `tag` (see `p2p/split.rs`);
/// a `FLAG_PULLED` CTS still ends the message.
pub(crate) const FLAG_SPLIT: u16 = 64;
/// `Abort` flag: the sender aborted a whole communicator (every operation on it, whatever its
/// tag, now and later), not one operation: the one whose frames carry the ids `comm`, `sig[0]`
/// and `sig[1]` (its point-to-point, collective and internal messages).
pub(crate) const FLAG_COMM_ABORT: u16 = 16;
/// `Abort` flag: the sender revoked a communicator (`Communicator::revoke`): the one whose
/// frames carry the ids `comm`, `sig[0]` and `sig[1]`, at the frame's epoch. A member forwards
/// it to every other member the first time it sees it (a reliable broadcast).
pub(crate) const FLAG_REVOKE: u16 = 32;

/// What a frame is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum FrameKind {
    /// A whole small message, payload follows.
    Eager = 1,
    /// Request to send a large message of `len` bytes as `msg_id`; no payload.
    Rts = 2,
    /// Clear to send `msg_id`; no payload.
    Cts = 3,
    /// `len` bytes of message `msg_id` at `offset`, payload follows.
    Data = 4,
    /// The sender is finalizing and sends nothing more.
    Close = 5,
    /// The sender abandoned the operation `(comm, tag)`, which it called as `sig`; no
    /// payload.
    Abort = 6,
    /// Nothing but a wake-up: the sender wrote to this rank's shared-memory ring while this
    /// rank slept in `epoll_wait`; no payload.
    Wake = 7,
    /// How many collectives of communicator `comm` (its collective channel) has the receiver
    /// entered? Asked at a collective's timeout and stall warning to name the members that
    /// never entered it; no payload.
    Ask = 12,
    /// The answer to an `Ask` about `comm`: the receiver had entered `msg_id` collectives of
    /// it (their sequence numbers are `0..msg_id`); no payload.
    Entered = 13,
}

/// A decoded, validated frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FrameHeader {
    /// What the frame is.
    pub kind: FrameKind,
    /// Kind-specific flags ([`FLAG_DISCARD`]).
    pub flags: u16,
    /// Communicator the message belongs to.
    pub comm: u64,
    /// Message tag.
    pub tag: u32,
    /// Sender's message sequence number (the rendezvous id); in an `Abort` of one operation,
    /// the world rank the sender had lost, plus one (0: it lost nobody).
    pub msg_id: u64,
    /// Payload bytes (`Eager`, `Data`) or message bytes (`Rts`).
    pub len: u64,
    /// Offset of a `Data` chunk in its message.
    pub offset: u64,
    /// Signature of the operation a message belongs to (what a collective was called with),
    /// checked by the receiver's matching layer; zero for plain point-to-point.
    pub sig: [u64; 2],
    /// The epoch of the communicator the frame belongs to (0 for a communicator no shrink
    /// made): a receiver drops a frame of an epoch its communicator has left behind.
    pub epoch: u32,
}

/// Why a header was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum WireError {
    /// The magic number is wrong: not an hcomm stream, or it lost its framing.
    #[error("bad magic {0:#010x}")]
    BadMagic(u32),
    /// Another wire version.
    #[error("unsupported wire version {0} (this build speaks {VERSION})")]
    BadVersion(u8),
    /// Unknown frame kind.
    #[error("unknown frame kind {0}")]
    BadKind(u8),
    /// Flags, reserved bits or fields that must be zero for this kind are set.
    #[error("invalid field {0} for this frame kind")]
    BadField(&'static str),
    /// A length beyond its bound.
    #[error("length {len} exceeds the limit {limit}")]
    TooLong {
        /// The announced length.
        len: u64,
        /// The bound it broke.
        limit: u64,
    },
}

impl FrameHeader {
    /// A header of `kind` with all other fields zero.
    pub(crate) fn new(kind: FrameKind) -> FrameHeader {
        FrameHeader {
            kind,
            flags: 0,
            comm: 0,
            tag: 0,
            msg_id: 0,
            len: 0,
            offset: 0,
            sig: [0; 2],
            epoch: 0,
        }
    }

    /// Bytes of payload that follow this header.
    pub(crate) fn payload_len(&self) -> u64 {
        match self.kind {
            FrameKind::Eager | FrameKind::Data => self.len,
            FrameKind::Rts
            | FrameKind::Cts
            | FrameKind::Close
            | FrameKind::Abort
            | FrameKind::Wake
            | FrameKind::Ask
            | FrameKind::Entered => 0,
        }
    }

    /// Encodes into the fixed wire layout.
    pub(crate) fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4] = VERSION;
        b[5] = self.kind as u8;
        b[6..8].copy_from_slice(&self.flags.to_le_bytes());
        b[8..16].copy_from_slice(&self.comm.to_le_bytes());
        b[16..20].copy_from_slice(&self.tag.to_le_bytes());
        b[20..24].copy_from_slice(&self.epoch.to_le_bytes());
        b[24..32].copy_from_slice(&self.msg_id.to_le_bytes());
        b[32..40].copy_from_slice(&self.len.to_le_bytes());
        b[40..48].copy_from_slice(&self.offset.to_le_bytes());
        b[48..56].copy_from_slice(&self.sig[0].to_le_bytes());
        b[56..64].copy_from_slice(&self.sig[1].to_le_bytes());
        b
    }

    /// The body of a shared-memory fast box message (see
    /// [`crate::transport::shm::fastbox`]) carrying this header and `payload`: only for an
    /// `Eager` frame whose payload fits, [`FAST_PAYLOAD`] bytes, or [`FAST_PAYLOAD_SIG`] with
    /// a signature, and of epoch 0 (a shrunk communicator's small messages take the ring).
    ///
    /// ```text
    /// word 0  comm
    ///      1  tag (bits 0..32) | payload length (32..40) | has signature (40..48) | flags (48..64)
    ///      2  msg_id
    ///      3.. signature (2 words, when it has one), then the payload, little-endian
    /// ```
    pub(crate) fn encode_fast(&self, payload: &[u8]) -> Option<[u64; FAST_WORDS]> {
        let signed = self.sig != [0; 2];
        let room = if signed {
            FAST_PAYLOAD_SIG
        } else {
            FAST_PAYLOAD
        };
        if self.kind != FrameKind::Eager
            || self.epoch != 0
            || self.offset != 0
            || self.len != payload.len() as u64
            || payload.len() > room
        {
            return None;
        }
        let mut body = [0u64; FAST_WORDS];
        body[0] = self.comm;
        body[1] = u64::from(self.tag)
            | (payload.len() as u64) << 32
            | u64::from(signed) << 40
            | u64::from(self.flags) << 48;
        body[2] = self.msg_id;
        let at = if signed {
            body[3..5].copy_from_slice(&self.sig);
            5
        } else {
            3
        };
        let mut bytes = [0u8; FAST_PAYLOAD];
        bytes[..payload.len()].copy_from_slice(payload);
        for (word, chunk) in body[at..].iter_mut().zip(bytes.chunks_exact(8)) {
            let mut b = [0u8; 8];
            b.copy_from_slice(chunk);
            *word = u64::from_le_bytes(b);
        }
        Some(body)
    }

    /// Decodes and validates the header of a fast box body ([`FrameHeader::encode_fast`]);
    /// [`FrameHeader::fast_payload_into`] copies the payload out afterwards (a small receive
    /// straight into the user's buffer, not through the stack, where the reloads of a
    /// 32-byte payload stalled on store forwarding).
    pub(crate) fn decode_fast_header(body: &[u64; FAST_WORDS]) -> Result<FrameHeader, WireError> {
        let len = (body[1] >> 32) & 0xff;
        let signed = match (body[1] >> 40) & 0xff {
            0 => false,
            1 => true,
            _ => return Err(WireError::BadField("fast frame signature flag")),
        };
        let room = if signed {
            FAST_PAYLOAD_SIG
        } else {
            FAST_PAYLOAD
        };
        if len > room as u64 {
            return Err(WireError::TooLong {
                len,
                limit: room as u64,
            });
        }
        let sig = if signed { [body[3], body[4]] } else { [0; 2] };
        if signed && sig == [0; 2] {
            return Err(WireError::BadField("fast frame signature"));
        }
        let h = FrameHeader {
            kind: FrameKind::Eager,
            flags: (body[1] >> 48) as u16,
            comm: body[0],
            tag: body[1] as u32,
            msg_id: body[2],
            len,
            offset: 0,
            sig,
            epoch: 0,
        };
        h.validate()?;
        Ok(h)
    }

    /// Copies the first `out.len()` bytes of the payload of `body`, a fast box body whose
    /// header [`FrameHeader::decode_fast_header`] accepted, into `out` (at most the
    /// payload's room).
    #[inline]
    pub(crate) fn fast_payload_into(body: &[u64; FAST_WORDS], out: &mut [u8]) {
        let at = if (body[1] >> 40) & 0xff == 0 { 3 } else { 5 };
        for (chunk, word) in out.chunks_mut(8).zip(&body[at..]) {
            chunk.copy_from_slice(&word.to_le_bytes()[..chunk.len()]);
        }
    }

    /// Decodes and validates a header.
    pub(crate) fn decode(b: &[u8; HEADER_LEN]) -> Result<FrameHeader, WireError> {
        let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u64_at = |i: usize| {
            let mut x = [0u8; 8];
            x.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(x)
        };
        let magic = u32_at(0);
        if magic != MAGIC {
            return Err(WireError::BadMagic(magic));
        }
        if b[4] != VERSION {
            return Err(WireError::BadVersion(b[4]));
        }
        let kind = match b[5] {
            1 => FrameKind::Eager,
            2 => FrameKind::Rts,
            3 => FrameKind::Cts,
            4 => FrameKind::Data,
            5 => FrameKind::Close,
            6 => FrameKind::Abort,
            7 => FrameKind::Wake,
            12 => FrameKind::Ask,
            13 => FrameKind::Entered,
            k => return Err(WireError::BadKind(k)),
        };
        let h = FrameHeader {
            kind,
            flags: u16_at(6),
            comm: u64_at(8),
            tag: u32_at(16),
            msg_id: u64_at(24),
            len: u64_at(32),
            offset: u64_at(40),
            sig: [u64_at(48), u64_at(56)],
            epoch: u32_at(20),
        };
        h.validate()?;
        Ok(h)
    }

    fn validate(&self) -> Result<(), WireError> {
        let allowed_flags = match self.kind {
            FrameKind::Cts => FLAG_DISCARD | FLAG_PULLED | FLAG_SPLIT,
            FrameKind::Abort => FLAG_MISMATCH | FLAG_COMM_ABORT | FLAG_REVOKE,
            FrameKind::Rts => FLAG_CAN_PULL,
            _ => 0,
        };
        if self.flags & !allowed_flags != 0 || self.flags.count_ones() > 1 {
            return Err(WireError::BadField("flags"));
        }
        let carries_offset = self.kind == FrameKind::Data
            || (self.kind == FrameKind::Rts && self.flags & FLAG_CAN_PULL != 0)
            || (self.kind == FrameKind::Cts && self.flags & FLAG_SPLIT != 0);
        if !carries_offset && self.offset != 0 {
            return Err(WireError::BadField("offset"));
        }
        let limit = match self.kind {
            FrameKind::Eager => MAX_EAGER,
            FrameKind::Data => MAX_CHUNK,
            FrameKind::Rts => MAX_MESSAGE,
            FrameKind::Cts
            | FrameKind::Close
            | FrameKind::Abort
            | FrameKind::Wake
            | FrameKind::Ask
            | FrameKind::Entered => 0,
        };
        if self.len > limit {
            return Err(WireError::TooLong {
                len: self.len,
                limit,
            });
        }
        if self.kind == FrameKind::Data && self.offset > MAX_MESSAGE - self.len {
            return Err(WireError::TooLong {
                len: self.offset,
                limit: MAX_MESSAGE - self.len,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fast box body's header and payload (the payload in the first `header.len` bytes),
    /// as a receive takes them.
    fn decode_fast(
        body: &[u64; FAST_WORDS],
    ) -> Result<(FrameHeader, [u8; FAST_PAYLOAD]), WireError> {
        let h = FrameHeader::decode_fast_header(body)?;
        let mut payload = [0u8; FAST_PAYLOAD];
        FrameHeader::fast_payload_into(body, &mut payload[..h.len as usize]);
        Ok((h, payload))
    }

    #[test]
    fn round_trip() {
        let h = FrameHeader {
            kind: FrameKind::Data,
            flags: 0,
            comm: 0xdead_beef_0000_0001,
            tag: 77,
            msg_id: 5,
            len: 4096,
            offset: 1 << 30,
            sig: [3, u64::MAX],
            epoch: 7,
        };
        assert_eq!(FrameHeader::decode(&h.encode()), Ok(h));
        let mut cts = FrameHeader::new(FrameKind::Cts);
        cts.flags = FLAG_DISCARD;
        assert_eq!(FrameHeader::decode(&cts.encode()), Ok(cts));
    }

    #[test]
    fn refuses_what_a_peer_could_corrupt() {
        let good = FrameHeader::new(FrameKind::Eager).encode();
        let mut b = good;
        b[0] ^= 1;
        assert!(matches!(
            FrameHeader::decode(&b),
            Err(WireError::BadMagic(_))
        ));
        let mut b = good;
        b[4] = 9;
        assert_eq!(FrameHeader::decode(&b), Err(WireError::BadVersion(9)));
        let mut b = good;
        b[5] = 0;
        assert_eq!(FrameHeader::decode(&b), Err(WireError::BadKind(0)));
        let mut b = good;
        b[6] = 1;
        assert_eq!(FrameHeader::decode(&b), Err(WireError::BadField("flags")));
        let mut h = FrameHeader::new(FrameKind::Eager);
        h.len = MAX_EAGER + 1;
        assert!(matches!(
            FrameHeader::decode(&h.encode()),
            Err(WireError::TooLong { .. })
        ));
        let mut h = FrameHeader::new(FrameKind::Data);
        h.len = 10;
        h.offset = u64::MAX - 5;
        assert!(matches!(
            FrameHeader::decode(&h.encode()),
            Err(WireError::TooLong { .. })
        ));
        let mut h = FrameHeader::new(FrameKind::Close);
        h.len = 1;
        assert!(FrameHeader::decode(&h.encode()).is_err());
    }

    /// A valid header of every kind with random fields within their limits.
    fn random_valid(rng: &mut crate::fuzz::Rng) -> FrameHeader {
        let kind = *rng.pick(&[
            FrameKind::Eager,
            FrameKind::Rts,
            FrameKind::Cts,
            FrameKind::Data,
            FrameKind::Close,
            FrameKind::Abort,
            FrameKind::Wake,
            FrameKind::Ask,
            FrameKind::Entered,
        ]);
        let mut h = FrameHeader::new(kind);
        h.comm = rng.next_u64();
        h.tag = rng.next_u64() as u32;
        h.msg_id = rng.next_u64();
        h.sig = [rng.next_u64(), rng.next_u64()];
        h.epoch = rng.next_u64() as u32;
        let below = |rng: &mut crate::fuzz::Rng, max: u64| rng.next_u64() % (max + 1);
        match kind {
            FrameKind::Eager => h.len = below(rng, MAX_EAGER),
            FrameKind::Data => {
                h.len = below(rng, MAX_CHUNK);
                h.offset = below(rng, MAX_MESSAGE - h.len);
            }
            FrameKind::Rts => {
                h.len = below(rng, MAX_MESSAGE);
                if rng.one_in(2) {
                    h.flags = FLAG_CAN_PULL;
                    h.offset = rng.next_u64();
                }
            }
            FrameKind::Cts => {
                h.flags = *rng.pick(&[0, FLAG_DISCARD, FLAG_PULLED, FLAG_SPLIT]);
                if h.flags == FLAG_SPLIT {
                    h.offset = rng.next_u64();
                }
            }
            FrameKind::Abort => {
                h.flags = *rng.pick(&[0, FLAG_MISMATCH, FLAG_COMM_ABORT, FLAG_REVOKE]);
            }
            FrameKind::Close | FrameKind::Wake | FrameKind::Ask | FrameKind::Entered => {}
        }
        h
    }

    /// Every 64 bytes a peer may send: decoding never panics or allocates, accepts exactly
    /// the canonical encodings of valid headers (so what it accepts re-encodes to the same
    /// bytes) with payloads within the limits, and valid headers round-trip.
    #[test]
    fn fuzz_frame_header() {
        let mut seed_rng = crate::fuzz::Rng::new(1);
        let target = crate::fuzz::Target {
            name: "wire::FrameHeader::decode",
            default_cases: 300_000,
            seeds: (0..64)
                .map(|_| random_valid(&mut seed_rng).encode().to_vec())
                .collect(),
            max_len: HEADER_LEN,
            dict: vec![
                MAGIC as u64,
                VERSION as u64,
                MAX_EAGER,
                MAX_CHUNK,
                MAX_MESSAGE,
                FLAG_DISCARD as u64,
                FLAG_MISMATCH as u64,
                FLAG_CAN_PULL as u64,
                FLAG_PULLED as u64,
                FLAG_SPLIT as u64,
                FLAG_COMM_ABORT as u64,
                FLAG_REVOKE as u64,
            ],
        };
        crate::fuzz::run(&target, |input, rng| {
            let mut b = [0u8; HEADER_LEN];
            b[..input.len()].copy_from_slice(input);
            let (decoded, usage) = crate::fuzz::measure(|| FrameHeader::decode(&b));
            assert_eq!(usage.largest, 0, "decoding allocated");
            if let Ok(h) = decoded {
                assert_eq!(h.encode(), b, "accepted a non-canonical encoding");
                assert!(h.payload_len() <= MAX_CHUNK.max(MAX_EAGER));
                assert!(h.kind != FrameKind::Data || h.offset + h.len <= MAX_MESSAGE);
            }
            let valid = random_valid(rng);
            assert_eq!(FrameHeader::decode(&valid.encode()), Ok(valid));
        });
    }

    /// Every fast box body a peer may write: decoding never panics, accepts only `Eager`
    /// frames within the fast limits, and what it accepts re-encodes to the same body;
    /// eligible frames round-trip.
    #[test]
    fn fuzz_fast_frame() {
        let mut seed_rng = crate::fuzz::Rng::new(2);
        let fast = |rng: &mut crate::fuzz::Rng| {
            let mut h = random_valid(rng);
            h.kind = FrameKind::Eager;
            h.flags = 0;
            h.offset = 0;
            h.epoch = 0;
            if rng.one_in(2) {
                h.sig = [0; 2];
            }
            let room = if h.sig == [0; 2] {
                FAST_PAYLOAD
            } else {
                FAST_PAYLOAD_SIG
            };
            let mut payload = vec![0u8; rng.below(room + 1)];
            rng.fill(&mut payload);
            h.len = payload.len() as u64;
            (h, payload)
        };
        let words = |body: [u64; FAST_WORDS]| body.iter().flat_map(|w| w.to_le_bytes()).collect();
        let seeds = (0..64)
            .map(|_| {
                let (h, p) = fast(&mut seed_rng);
                words(h.encode_fast(&p).unwrap())
            })
            .collect();
        let target = crate::fuzz::Target {
            name: "wire::FrameHeader::decode_fast_header",
            default_cases: 300_000,
            seeds,
            max_len: FAST_WORDS * 8,
            dict: vec![1 << 40, 32 << 32, 16 << 32, FLAG_MISMATCH as u64],
        };
        crate::fuzz::run(&target, |input, rng| {
            let mut b = [0u8; FAST_WORDS * 8];
            b[..input.len()].copy_from_slice(input);
            let body: [u64; FAST_WORDS] = std::array::from_fn(|i| {
                let mut w = [0u8; 8];
                w.copy_from_slice(&b[i * 8..i * 8 + 8]);
                u64::from_le_bytes(w)
            });
            if let Ok((h, payload)) = decode_fast(&body) {
                assert_eq!(h.kind, FrameKind::Eager);
                let p = &payload[..h.len as usize];
                let again = h.encode_fast(p).expect("an accepted frame fits a fast box");
                // Bytes past the payload are not part of the frame.
                let keep = |body: &[u64; FAST_WORDS]| {
                    let mut bytes: Vec<u8> = words(*body);
                    let at = if h.sig == [0; 2] { 24 } else { 40 };
                    bytes.truncate(at + p.len());
                    bytes
                };
                assert_eq!(keep(&again), keep(&body), "accepted a non-canonical body");
            }
            let (h, p) = fast(rng);
            let (back, payload) = decode_fast(&h.encode_fast(&p).unwrap()).unwrap();
            assert_eq!((back, &payload[..p.len()]), (h, &p[..]));
        });
    }

    #[test]
    fn only_small_eager_frames_fit_a_fast_box() {
        let mut h = FrameHeader::new(FrameKind::Eager);
        h.len = FAST_PAYLOAD as u64;
        assert!(h.encode_fast(&[1; FAST_PAYLOAD]).is_some());
        h.len += 1;
        assert!(h.encode_fast(&[1; FAST_PAYLOAD + 1]).is_none());
        h.sig = [1, 2];
        h.len = FAST_PAYLOAD_SIG as u64;
        assert!(h.encode_fast(&[1; FAST_PAYLOAD_SIG]).is_some());
        h.len += 1;
        assert!(h.encode_fast(&[1; FAST_PAYLOAD_SIG + 1]).is_none());
        h.epoch = 1;
        h.len = FAST_PAYLOAD_SIG as u64;
        assert!(
            h.encode_fast(&[1; FAST_PAYLOAD_SIG]).is_none(),
            "a shrunk communicator's frames carry their epoch: not in a fast box"
        );
        let mut rts = FrameHeader::new(FrameKind::Rts);
        rts.len = 1 << 20;
        assert!(rts.encode_fast(&[]).is_none());
    }
}
