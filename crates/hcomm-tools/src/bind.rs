//! Where `hcommrun` pins its ranks (`--bind-to core|none`).
//!
//! The CPUs hcommrun may run on (its own affinity mask, which a container, `taskset` or a
//! batch system may have narrowed) are grouped into cores by the kernel's topology
//! (`/sys/devices/system/cpu/cpuN/topology`: package and core id); rank `r` is pinned to the
//! `r`-th core, to every hardware thread of it that the mask allows, as
//! `mpirun --bind-to core` (mapping by core) does. Without a choice, ranks are pinned when
//! they fit, one per core, and left alone when there are more ranks than cores.

use std::io;

use rustix::thread::CpuSet;

/// How ranks are bound to CPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BindTo {
    /// Each rank on a core of its own.
    Core,
    /// Every rank keeps the launcher's CPU mask.
    None,
}

impl BindTo {
    /// The value of `HCOMM_BIND_TO` for this choice.
    pub fn name(self) -> &'static str {
        match self {
            BindTo::Core => "core",
            BindTo::None => "none",
        }
    }
}

/// The hardware threads of one core that the mask allows, ascending.
pub type Core = Vec<usize>;

/// The CPUs in `set`, ascending.
pub fn cpus_of(set: &CpuSet) -> Vec<usize> {
    (0..CpuSet::MAX_CPU).filter(|&c| set.is_set(c)).collect()
}

/// A mask holding exactly `cpus` (those beyond [`CpuSet::MAX_CPU`] are left out).
pub fn set_of(cpus: &[usize]) -> CpuSet {
    let mut set = CpuSet::new();
    for &c in cpus.iter().filter(|&&c| c < CpuSet::MAX_CPU) {
        set.set(c);
    }
    set
}

/// Groups `allowed` CPUs into cores: CPUs with the same `(package, core)` from `topology`
/// share a core; a CPU whose topology is unknown is a core of its own. Cores come in the
/// order of their lowest CPU.
pub fn group_cores(allowed: &[usize], topology: impl Fn(usize) -> Option<(u32, u32)>) -> Vec<Core> {
    let mut cores: Vec<(Option<(u32, u32)>, Core)> = Vec::new();
    let mut sorted = allowed.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    for cpu in sorted {
        let id = topology(cpu);
        match cores.iter_mut().find(|(k, _)| id.is_some() && *k == id) {
            Some((_, threads)) => threads.push(cpu),
            None => cores.push((id, vec![cpu])),
        }
    }
    cores.into_iter().map(|(_, threads)| threads).collect()
}

/// `(package, core)` of `cpu` from sysfs, if the kernel reports it.
fn sysfs_topology(cpu: usize) -> Option<(u32, u32)> {
    let read = |what: &str| -> Option<u32> {
        let path = format!("/sys/devices/system/cpu/cpu{cpu}/topology/{what}");
        std::fs::read_to_string(path).ok()?.trim().parse().ok()
    };
    Some((read("physical_package_id")?, read("core_id")?))
}

/// The cores this process may run on: its affinity mask grouped by the kernel's topology.
pub fn allowed_cores() -> io::Result<Vec<Core>> {
    let mask = rustix::thread::sched_getaffinity(None)?;
    Ok(group_cores(&cpus_of(&mask), sysfs_topology))
}

/// The binding of `ranks` ranks over `cores`: what was chosen, and for each rank the CPUs it
/// is pinned to (`None`: left with the launcher's mask). `--bind-to core` with more ranks
/// than cores is an error, as with `mpirun`.
pub fn plan(
    choice: Option<BindTo>,
    ranks: u32,
    cores: &[Core],
) -> Result<(BindTo, Vec<Option<Core>>), String> {
    let fits = ranks as usize <= cores.len();
    let bind = match choice {
        Some(BindTo::Core) if !fits => {
            return Err(format!(
                "--bind-to core: {ranks} ranks but only {} core(s) allowed here; use \
                 --bind-to none to oversubscribe",
                cores.len()
            ))
        }
        Some(b) => b,
        None if fits => BindTo::Core,
        None => BindTo::None,
    };
    let per_rank = (0..ranks as usize)
        .map(|r| (bind == BindTo::Core).then(|| cores[r].clone()))
        .collect();
    Ok((bind, per_rank))
}

/// `cpus` as a comma list, the value of `HCOMM_BIND_CPUS`.
pub fn cpu_list(cpus: &[usize]) -> String {
    cpus.iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_of_a_core_group_together_and_unknown_cpus_stand_alone() {
        // Two cores with two threads each (siblings 0/2 and 1/3), CPU 5 of unknown topology.
        let topo = |cpu: usize| (cpu < 4).then_some((0, (cpu % 2) as u32));
        assert_eq!(
            group_cores(&[3, 0, 1, 2, 5, 6], |c| if c == 6 { None } else { topo(c) }),
            [vec![0, 2], vec![1, 3], vec![5], vec![6]]
        );
        // The same core id in another package is another core.
        let two_packages = |cpu: usize| Some(((cpu / 2) as u32, 0));
        assert_eq!(group_cores(&[0, 1, 2], two_packages), [vec![0, 1], vec![2]]);
        assert!(group_cores(&[], topo).is_empty());
    }

    #[test]
    fn ranks_are_pinned_when_they_fit_and_left_alone_otherwise() {
        let cores = vec![vec![0, 2], vec![1, 3]];
        let (bind, per_rank) = plan(None, 2, &cores).unwrap();
        assert_eq!(bind, BindTo::Core);
        assert_eq!(per_rank, [Some(vec![0, 2]), Some(vec![1, 3])]);
        assert_eq!(plan(None, 1, &cores).unwrap().1, [Some(vec![0, 2])]);

        let (bind, per_rank) = plan(None, 3, &cores).unwrap();
        assert_eq!((bind, per_rank), (BindTo::None, vec![None, None, None]));
        let (bind, per_rank) = plan(Some(BindTo::None), 2, &cores).unwrap();
        assert_eq!((bind, per_rank), (BindTo::None, vec![None, None]));

        let err = plan(Some(BindTo::Core), 3, &cores).unwrap_err();
        assert!(err.contains("3 ranks") && err.contains("2 core"), "{err}");
    }

    #[test]
    fn masks_and_lists_round_trip() {
        let cpus = [0, 3, 17];
        assert_eq!(cpus_of(&set_of(&cpus)), cpus);
        assert_eq!(cpu_list(&cpus), "0,3,17");
        assert_eq!(cpu_list(&[]), "");
        assert!(cpus_of(&set_of(&[CpuSet::MAX_CPU])).is_empty());
    }
}
