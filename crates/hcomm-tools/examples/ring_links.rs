//! What a rank holds when it only talks to its ring neighbours: each rank runs a few ring
//! all-reduces (`HCOMM_ALGO=allreduce:ring`; over TCP with `HCOMM_TRANSPORT=tcp`), then prints
//! its open descriptors, its sockets among them, and the TCP connections it opened and
//! accepted (links are made on a pair's first use, so they grow with the peers a rank talks
//! to, not with the job).
//!
//! `HCOMM_TRANSPORT=tcp HCOMM_ALGO=allreduce:ring hcommrun -n 32 -- target/release/examples/ring_links`

use hcomm::{Communicator, ReduceOp};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let comm = Communicator::init()?;
    let mut data = vec![1.0f32; 1 << 16];
    for _ in 0..4 {
        comm.allreduce_in_place(&mut data, ReduceOp::Max)?;
    }
    let (mut fds, mut sockets) = (0, 0);
    for entry in std::fs::read_dir("/proc/self/fd")?.flatten() {
        fds += 1;
        let target = std::fs::read_link(entry.path()).unwrap_or_default();
        sockets += usize::from(target.to_string_lossy().starts_with("socket:"));
    }
    let s = comm.protocol_stats();
    println!(
        "rank {} of {}: fds {fds} sockets {sockets} tcp_opened {} tcp_accepted {}",
        comm.rank(),
        comm.size(),
        s.tcp_opened,
        s.tcp_accepted
    );
    comm.destroy()?;
    Ok(())
}
