//! Where the ranks run: host identity, process, NUMA node and CPU of every rank.
//!
//! Every rank publishes its [`RankInfo`] at communicator creation; all ranks then hold the
//! same [`Topology`] (the rank -> host map) from which local ranks and, later, per-pair
//! transports are derived.

use std::fmt::Write as _;

use crate::error::{Error, PeerRank, Result};

/// What one rank tells the others about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankInfo {
    /// Host identity: hostname plus the kernel boot id, so that two machines with the same
    /// hostname are told apart.
    pub host_id: String,
    /// Hostname, for people.
    pub hostname: String,
    /// Process id on its host.
    pub pid: u32,
    /// NUMA node of the CPU the rank ran on at creation (0 when unknown).
    pub numa_node: u32,
    /// CPU the rank ran on at creation.
    pub cpu: u32,
}

/// The host's online cores (at least 1).
fn online_cores() -> usize {
    // SAFETY: sysconf has no preconditions; it returns -1 on error.
    let online = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    usize::try_from(online).unwrap_or(1).max(1)
}

/// How many CPUs this process may run on (its affinity mask; the host's online cores when
/// the mask cannot be read).
fn allowed_cpus() -> usize {
    match rustix::thread::sched_getaffinity(None) {
        Ok(set) => set.count().max(1) as usize,
        Err(_) => online_cores(),
    }
}

impl RankInfo {
    /// Describes the calling process; `host_id` replaces the detected host identity
    /// (`HCOMM_HOST_ID`).
    pub(crate) fn current(host_id: Option<&str>) -> RankInfo {
        let hostname = rustix::system::uname()
            .nodename()
            .to_string_lossy()
            .into_owned();
        let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .map(|s| s.trim().to_owned())
            .unwrap_or_default();
        // SAFETY: sched_getcpu has no preconditions; it returns -1 on failure.
        let cpu = unsafe { libc::sched_getcpu() };
        let cpu = u32::try_from(cpu).unwrap_or(0);
        RankInfo {
            host_id: host_id.map_or_else(|| format!("{hostname}/{boot_id}"), str::to_owned),
            hostname,
            pid: std::process::id(),
            numa_node: numa_node_of_cpu(cpu),
            cpu,
        }
    }

    /// Encodes for the rendezvous store: fields separated by newlines.
    pub(crate) fn encode(&self) -> Vec<u8> {
        format!(
            "{}\n{}\n{}\n{}\n{}",
            self.host_id, self.hostname, self.pid, self.numa_node, self.cpu
        )
        .into_bytes()
    }

    /// Decodes what [`RankInfo::encode`] wrote; anything else is an error naming `rank`.
    pub(crate) fn decode(rank: usize, bytes: &[u8]) -> Result<RankInfo> {
        let bad = || {
            Error::init(format!(
                "rank {rank} published malformed topology information"
            ))
            .with_peer(PeerRank::world(rank))
        };
        let text = std::str::from_utf8(bytes).map_err(|_| bad())?;
        let fields: Vec<&str> = text.split('\n').collect();
        let [host_id, hostname, pid, numa, cpu] = fields[..] else {
            return Err(bad());
        };
        Ok(RankInfo {
            host_id: host_id.to_owned(),
            hostname: hostname.to_owned(),
            pid: pid.parse().map_err(|_| bad())?,
            numa_node: numa.parse().map_err(|_| bad())?,
            cpu: cpu.parse().map_err(|_| bad())?,
        })
    }
}

fn numa_node_of_cpu(cpu: u32) -> u32 {
    let dir = format!("/sys/devices/system/cpu/cpu{cpu}");
    std::fs::read_dir(dir)
        .ok()
        .and_then(|entries| {
            entries.filter_map(|e| e.ok()).find_map(|e| {
                e.file_name()
                    .to_str()?
                    .strip_prefix("node")?
                    .parse::<u32>()
                    .ok()
            })
        })
        .unwrap_or(0)
}

/// The rank -> host map of a communicator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    ranks: Vec<RankInfo>,
    /// Host index of each rank, hosts numbered in order of their first rank.
    host_of: Vec<usize>,
    /// Rank among the ranks of the same host.
    local_rank: Vec<usize>,
    /// Number of ranks on each host.
    host_size: Vec<usize>,
}

impl Topology {
    /// Builds the map from every rank's information, indexed by rank.
    pub(crate) fn new(ranks: Vec<RankInfo>) -> Topology {
        let mut hosts: Vec<&str> = Vec::new();
        let mut host_of = Vec::with_capacity(ranks.len());
        let mut local_rank = Vec::with_capacity(ranks.len());
        let mut host_size: Vec<usize> = Vec::new();
        for info in &ranks {
            let h = match hosts.iter().position(|h| *h == info.host_id) {
                Some(h) => h,
                None => {
                    hosts.push(&info.host_id);
                    host_size.push(0);
                    hosts.len() - 1
                }
            };
            host_of.push(h);
            local_rank.push(host_size[h]);
            host_size[h] += 1;
        }
        Topology {
            ranks,
            host_of,
            local_rank,
            host_size,
        }
    }

    /// The topology of ranks chosen from this one, in the given order.
    pub(crate) fn subset(&self, members: &[usize]) -> Topology {
        Topology::new(members.iter().map(|&r| self.ranks[r].clone()).collect())
    }

    /// Number of ranks.
    pub fn size(&self) -> usize {
        self.ranks.len()
    }

    /// Information about one rank.
    pub fn rank(&self, rank: usize) -> &RankInfo {
        &self.ranks[rank]
    }

    /// Index of the host `rank` runs on.
    pub fn host_of(&self, rank: usize) -> usize {
        self.host_of[rank]
    }

    /// Rank of `rank` among the ranks on its host.
    pub fn local_rank(&self, rank: usize) -> usize {
        self.local_rank[rank]
    }

    /// Number of ranks on the host of `rank`.
    pub fn local_size(&self, rank: usize) -> usize {
        self.host_size[self.host_of[rank]]
    }

    /// The cores that the ranks on the host of `rank` (the calling process) can run on
    /// together, at least 1: the CPUs of its own affinity mask, or the distinct CPUs the
    /// host's ranks ran on at creation if more (ranks pinned one per core, by `taskset` or
    /// `hcommrun`, each have a mask of one CPU but a core each), never more than the host's
    /// online cores. Fewer than [`Topology::local_size`] means more runnable ranks than
    /// cores: the waits then sleep instead of spinning.
    pub(crate) fn local_cores(&self, rank: usize) -> usize {
        self.cores_with(rank, allowed_cpus(), online_cores())
    }

    /// [`Topology::local_cores`] for a process that may run on `allowed` CPUs of a host with
    /// `online` online.
    fn cores_with(&self, rank: usize, allowed: usize, online: usize) -> usize {
        let host = self.host_of[rank];
        let mut cpus: Vec<u32> = (0..self.size())
            .filter(|&r| self.host_of[r] == host)
            .map(|r| self.ranks[r].cpu)
            .collect();
        cpus.sort_unstable();
        cpus.dedup();
        allowed.max(cpus.len()).min(online).max(1)
    }

    /// Number of distinct hosts.
    pub fn num_hosts(&self) -> usize {
        self.host_size.len()
    }

    /// A table for people: one line per rank.
    pub fn table(&self) -> String {
        let mut out = format!(
            "hcomm topology: {} ranks on {} hosts\n{:>5} {:>5} {:>6} {:<24} {:>8} {:>4} {:>4}\n",
            self.size(),
            self.num_hosts(),
            "rank",
            "host",
            "local",
            "hostname",
            "pid",
            "numa",
            "cpu"
        );
        for (r, info) in self.ranks.iter().enumerate() {
            let _ = writeln!(
                out,
                "{:>5} {:>5} {:>6} {:<24} {:>8} {:>4} {:>4}",
                r,
                self.host_of[r],
                self.local_rank[r],
                info.hostname,
                info.pid,
                info.numa_node,
                info.cpu
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(host: &str, pid: u32) -> RankInfo {
        RankInfo {
            host_id: host.into(),
            hostname: host.into(),
            pid,
            numa_node: 0,
            cpu: 1,
        }
    }

    #[test]
    fn encode_decode_round_trip() {
        let me = RankInfo::current(None);
        assert_eq!(RankInfo::decode(3, &me.encode()).unwrap(), me);
        assert!(RankInfo::decode(3, b"a\nb").is_err());
        assert!(RankInfo::decode(3, &[0xff, 0xfe]).is_err());
    }

    #[test]
    fn hosts_and_local_ranks() {
        let t = Topology::new(vec![info("a", 1), info("b", 2), info("a", 3), info("b", 4)]);
        assert_eq!(t.num_hosts(), 2);
        assert_eq!(
            (0..4).map(|r| t.host_of(r)).collect::<Vec<_>>(),
            [0, 1, 0, 1]
        );
        assert_eq!(
            (0..4).map(|r| t.local_rank(r)).collect::<Vec<_>>(),
            [0, 0, 1, 1]
        );
        assert_eq!(t.local_size(2), 2);
        let s = t.subset(&[3, 1]);
        assert_eq!((s.num_hosts(), s.local_rank(1)), (1, 1));
        assert!(t.table().contains("4 ranks on 2 hosts"));
    }

    #[test]
    fn local_cores_tell_pinned_ranks_from_oversubscribed_ones() {
        let on = |cpus: &[u32]| {
            Topology::new(
                cpus.iter()
                    .enumerate()
                    .map(|(r, &cpu)| RankInfo {
                        cpu,
                        ..info(if r == 3 { "other" } else { "a" }, r as u32)
                    })
                    .collect(),
            )
        };
        // Two ranks pinned one per core of a 2-core host: a mask of 1 CPU each, 2 cores.
        assert_eq!(on(&[0, 1]).cores_with(0, 1, 2), 2);
        // Both pinned to one CPU: 1 core for 2 ranks.
        assert_eq!(on(&[1, 1]).cores_with(1, 1, 2), 1);
        // Eight unpinned ranks on a 2-core host: the mask (2) whatever CPUs they ran on.
        let eight = on(&[0, 1, 1, 9, 0, 1, 0, 1]);
        assert_eq!(eight.local_size(0), 7);
        assert_eq!(eight.cores_with(0, 2, 2), 2);
        // Never more than the host has online, nor fewer than 1.
        assert_eq!(on(&[0, 5, 6]).cores_with(0, 1, 2), 2);
        assert_eq!(on(&[0]).cores_with(0, 0, 0), 1);
        // Only the ranks of the caller's host count: rank 3 is alone on "other".
        assert_eq!(eight.cores_with(3, 1, 64), 1);
        assert_eq!(eight.cores_with(0, 1, 64), 2);
        // This process's own view: at least one core, at most the online ones.
        let own = on(&[0]).local_cores(0);
        assert!((1..=online_cores()).contains(&own));
    }

    fn random_info(rng: &mut crate::fuzz::Rng) -> RankInfo {
        let text = |rng: &mut crate::fuzz::Rng| -> String {
            (0..rng.len(40))
                .map(|_| char::from(*rng.pick(b"ab-/.:09 \t\xe9")))
                .collect()
        };
        RankInfo {
            host_id: text(rng),
            hostname: text(rng),
            pid: rng.next_u64() as u32,
            numa_node: rng.next_u64() as u32,
            cpu: rng.next_u64() as u32,
        }
    }

    /// Whatever a rank publishes about itself: decoding never panics, accepts five lines
    /// with numbers where numbers belong (which encode to an entry that decodes the same),
    /// refuses the rest with an error naming the rank, allocates in proportion to the entry,
    /// and valid entries round-trip.
    #[test]
    fn fuzz_rank_info_decode() {
        let mut rng = crate::fuzz::Rng::new(9);
        let target = crate::fuzz::Target {
            name: "topology RankInfo::decode",
            default_cases: 100_000,
            seeds: (0..16).map(|_| random_info(&mut rng).encode()).collect(),
            max_len: 512,
            dict: vec![u32::MAX as u64, u64::from(b'\n')],
        };
        crate::fuzz::run(&target, |input, rng| {
            let (decoded, usage) = crate::fuzz::measure(|| RankInfo::decode(5, input));
            assert!(usage.peak <= 8 * input.len() + 1024, "{usage:?}");
            match decoded {
                Ok(info) => assert_eq!(RankInfo::decode(5, &info.encode()).unwrap(), info),
                Err(Error::Init(info)) => assert_eq!(info.peer, Some(PeerRank::world(5)), "{info}"),
                Err(e) => panic!("{e}"),
            }
            let valid = random_info(rng);
            assert_eq!(RankInfo::decode(5, &valid.encode()).unwrap(), valid);
        });
    }
}
