//! The libfabric transport from Rust, on jobs of real processes (this test binary started again
//! as each rank) over the tcp provider (`FI_PROVIDER=tcp`, `HCOMM_TRANSPORT=ofi`): messages on
//! both sides of both protocol thresholds, the registration cache (a hit while two sends share
//! a buffer, a new registration when a buffer is freed and its address reused), pool memory
//! through its block's registration (no registration of its own), and a machine
//! without libfabric (the transport says it is unavailable; TCP and shared memory still work).
//! The test machine has libfabric (scripts/test-env.sh installs it).

use hcomm::{Communicator, Error, Lease, ReduceOp};
use hcomm_testkit::{job_ok, self_job};

/// Environment of a rank: the scenario it runs.
const SCENARIO: &str = "HCOMM_OFI_TEST_SCENARIO";
/// libfabric's tcp provider, forced.
const OFI: [(&str, &str); 2] = [("HCOMM_TRANSPORT", "ofi"), ("FI_PROVIDER", "tcp")];
/// A library name no machine has.
const MISSING: (&str, &str) = ("HCOMM_OFI_LIB", "libfabric-missing-for-hcomm-tests.so.1");

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

/// Ring exchanges at sizes around 4 KiB, the default eager limit (64 KiB) and 1 MiB; every
/// protocol counted.
fn sizes(comm: &Communicator) {
    let (r, n) = (comm.rank(), comm.size());
    let sizes = [
        0,
        1,
        4095,
        4096,
        4097,
        (64 << 10) - 1,
        64 << 10,
        (64 << 10) + 1,
        100_000,
        (1 << 20) - 1,
        1 << 20,
        (1 << 20) + 1,
        5 << 20,
    ];
    for (round, &len) in sizes.iter().enumerate() {
        let out = pattern(len, (r * 16 + round) as u8);
        let mut got = vec![0u8; len];
        let left = (r + n - 1) % n;
        let k = comm
            .sendrecv(&out, (r + 1) % n, 3, &mut got, left, 3)
            .unwrap();
        assert_eq!(k, len);
        assert!(
            got == pattern(len, (left * 16 + round) as u8),
            "{len} bytes from {left}"
        );
    }
    let s = comm.protocol_stats();
    assert!(
        s.ofi_eager > 0 && s.ofi_read > 0 && s.ofi_write > 0,
        "{s:?}"
    );
    assert_eq!(s.tcp_eager + s.tcp_rendezvous + s.shm_eager, 0, "{s:?}");
    println!("OK sizes");
}

/// Rank 0 sends one buffer twice at once: the second send finds the first's registration.
/// Then a buffer is mapped, sent, unmapped and mapped again at the same address with other
/// bytes: the second send registers it anew (nothing stale is reused) and its bytes arrive.
fn cache(comm: &Communicator) {
    const LEN: usize = 256 << 10;
    let buf: &'static mut [u8] = Box::leak(pattern(LEN, 7).into_boxed_slice());
    let before = comm.protocol_stats();
    if comm.rank() == 0 {
        let reqs: Vec<_> = (0..2)
            .map(|tag| {
                // SAFETY: the leaked buffer lives for ever; nothing writes it.
                let lease = unsafe { Lease::from_raw_parts_const(buf.as_ptr(), LEN) };
                comm.isend_raw(lease, 1, tag).unwrap()
            })
            .collect();
        comm.barrier().unwrap();
        for r in reqs {
            r.wait().unwrap();
        }
        let s = comm.protocol_stats();
        assert_eq!(s.ofi_mr_hits - before.ofi_mr_hits, 1, "{s:?}");
    } else {
        comm.barrier().unwrap();
        for tag in 0..2 {
            let mut got = vec![0u8; LEN];
            comm.recv(&mut got, 0, tag).unwrap();
            assert!(got[..] == buf[..]);
        }
    }
    let mut at: *mut libc::c_void = std::ptr::null_mut();
    for round in 0..2u8 {
        let before = comm.protocol_stats();
        if comm.rank() == 0 {
            let flags = libc::MAP_PRIVATE
                | libc::MAP_ANONYMOUS
                | if at.is_null() {
                    0
                } else {
                    libc::MAP_FIXED_NOREPLACE
                };
            // SAFETY: a fresh anonymous mapping (at the first one's address the second time,
            // which was unmapped: MAP_FIXED_NOREPLACE fails rather than replace anything).
            let p =
                unsafe { libc::mmap(at, LEN, libc::PROT_READ | libc::PROT_WRITE, flags, -1, 0) };
            assert_ne!(p, libc::MAP_FAILED);
            if !at.is_null() {
                assert_eq!(p, at, "the address was not reused");
            }
            at = p;
            // SAFETY: the mapping holds LEN bytes until the munmap below.
            let mem = unsafe { std::slice::from_raw_parts_mut(p.cast::<u8>(), LEN) };
            mem.copy_from_slice(&pattern(LEN, round));
            comm.send(mem, 1, 9).unwrap();
            // SAFETY: the send completed: nothing uses the mapping any more.
            assert_eq!(unsafe { libc::munmap(p, LEN) }, 0);
            let s = comm.protocol_stats();
            assert_eq!(s.ofi_mr_hits, before.ofi_mr_hits, "round {round}: {s:?}");
            assert_eq!(
                s.ofi_mr_misses - before.ofi_mr_misses,
                1,
                "round {round}: {s:?}"
            );
        } else {
            let mut got = vec![0u8; LEN];
            comm.recv(&mut got, 0, 9).unwrap();
            assert!(got == pattern(LEN, round), "round {round}");
        }
        comm.barrier().unwrap();
    }
    println!("OK cache");
}

/// Pool memory is registered with its block, when the block is made: transfers from and to it
/// (RDMA read and write sizes) make no registration of their own, but for the destination of
/// each RDMA write, which is exposed to the peer's write and so registered on its own (a
/// receive given up revokes it), in rounds that free the buffers and allocate them again (an
/// ordinary block, kept; a grown one, given back and reserved anew); the bytes arrive exactly.
fn pool(comm: &Communicator) {
    let (r, n) = (comm.rank(), comm.size());
    let (right, left) = ((r + 1) % n, (r + n - 1) % n);
    // A grown block of its own (over HCOMM_POOL_BLOCK, 4 MiB in this test): a multiple of
    // 2 MiB, so that freeing and allocating it again gives back and reserves every page.
    let grown = 6 << 20;
    for round in 0..3u8 {
        let before = comm.protocol_stats();
        // Read, read, written, written.
        for len in [128 << 10, 1 << 20, (1 << 20) + 1, grown] {
            let mut out = comm.alloc::<u8>(len).unwrap();
            let mut got = comm.alloc::<u8>(len).unwrap();
            assert!(
                out.in_pool() && got.in_pool(),
                "{len} bytes not from the pool"
            );
            out.copy_from_slice(&pattern(len, round ^ r as u8));
            let k = comm.sendrecv(&out, right, 5, &mut got, left, 5).unwrap();
            assert_eq!(k, len);
            assert!(
                got[..] == pattern(len, round ^ left as u8)[..],
                "round {round}: {len} bytes from {left}"
            );
        }
        let s = comm.protocol_stats();
        assert_eq!(
            s.ofi_mr_misses - before.ofi_mr_misses,
            2,
            "round {round}: the two destinations of writes only: {s:?}"
        );
        assert_eq!(s.ofi_mr_hits, before.ofi_mr_hits, "round {round}: {s:?}");
        assert!(s.ofi_read > before.ofi_read, "round {round}: {s:?}");
        assert!(s.ofi_write > before.ofi_write, "round {round}: {s:?}");
        // Each read's sender found its block's region (the readers and writers over the tcp
        // provider need no local one).
        assert!(
            s.ofi_mr_pool - before.ofi_mr_pool >= 2,
            "round {round}: {s:?}"
        );
    }
    let s = comm.protocol_stats();
    // The ordinary block, and the grown one each time it was backed again.
    assert!(s.ofi_pool_blocks >= 2, "{s:?}");
    assert!(
        s.ofi_mr_invalidations >= 1,
        "the grown block was given back: {s:?}"
    );
    println!("OK pool");
}

/// The library is missing: forced, the world fails with NotSupported saying so; by default
/// shared memory and TCP carry the job.
fn missing(comm: Option<Communicator>) {
    match comm {
        None => {
            let e = Communicator::init()
                .err()
                .expect("init must fail without libfabric");
            assert!(matches!(e, Error::NotSupported(_)), "{e}");
            assert!(e.to_string().contains("cannot load"), "{e}");
            assert!(e.to_string().contains("HCOMM_TRANSPORT=ofi"), "{e}");
            println!("OK missing: {e}");
        }
        Some(comm) => {
            let mut v = vec![comm.rank() as f64 + 1.0; 300_000];
            comm.allreduce_in_place(&mut v, ReduceOp::Sum).unwrap();
            let n = comm.size() as f64;
            assert!(v.iter().all(|&x| x == n * (n + 1.0) / 2.0));
            let s = comm.protocol_stats();
            assert_eq!(s.ofi_eager + s.ofi_read + s.ofi_write, 0, "{s:?}");
            println!("OK fallback");
        }
    }
}

/// The entry of a rank started by the tests (ignored in normal runs).
#[test]
#[ignore = "a rank of the jobs the other tests start"]
fn rank_of_a_job() {
    match std::env::var(SCENARIO).as_deref() {
        Ok("sizes") => sizes(&Communicator::init().unwrap()),
        Ok("cache") => cache(&Communicator::init().unwrap()),
        Ok("pool") => pool(&Communicator::init().unwrap()),
        Ok("missing-forced") => missing(None),
        Ok("missing") => missing(Some(Communicator::init().unwrap())),
        other => panic!("no scenario {other:?}"),
    }
}

#[test]
fn messages_around_both_thresholds_take_every_protocol_through_libfabric() {
    job_ok(SCENARIO, "sizes", 3, &OFI);
}

#[test]
fn the_registration_cache_hits_while_shared_and_registers_a_reused_address_anew() {
    job_ok(SCENARIO, "cache", 2, &OFI);
}

#[test]
fn pool_memory_goes_through_its_blocks_registration_with_no_registration_of_its_own() {
    job_ok(
        SCENARIO,
        "pool",
        2,
        &[OFI[0], OFI[1], ("HCOMM_POOL_BLOCK", "4194304")],
    );
}

#[test]
fn without_libfabric_the_transport_is_unavailable_and_tcp_and_shm_still_work() {
    let env = [
        (SCENARIO, "missing-forced"),
        OFI[0],
        MISSING,
        ("HCOMM_TIMEOUT", "30"),
    ];
    // Each rank fails at init on its own, before it waits for any peer.
    for (r, (_, text)) in self_job(2, &env).iter().enumerate() {
        assert!(text.contains("OK missing"), "rank {r}:\n{text}");
    }
    job_ok(SCENARIO, "missing", 3, &[MISSING]);
    job_ok(
        SCENARIO,
        "missing",
        2,
        &[MISSING, ("HCOMM_TRANSPORT", "tcp")],
    );
}
