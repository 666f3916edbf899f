//! Which network interfaces (rails) a rank listens on and announces: `HCOMM_SOCKET_IFNAME`
//! with NCCL's syntax, and the default choice.
//!
//! **Syntax** (NCCL's `NCCL_SOCKET_IFNAME`): a comma-separated list of interface names,
//! each a prefix (`eth` selects `eth0` and `eth1`); a leading `^` excludes the names listed
//! instead of selecting them; a leading `=` (after the `^`, if any) makes every name of the
//! list exact (`=eth0` selects `eth0` only, `^=eth1` every interface but `eth1`). Spaces
//! around names are ignored. An empty value (or only commas and spaces) means unset.
//!
//! **Default**: every interface that is up and has a usable address, except loopback and the
//! virtual bridges of containers and hypervisors (names starting with `docker`, `virbr`,
//! `br-`, `lxcbr`, `cni`): those carry no traffic between hosts. Veth interfaces are kept,
//! since a container's or namespace's own end of a veth pair is its real link (the tests use
//! veth pairs as rails); a host's ends of its containers' veths, plugged into a bridge, have
//! no address and are skipped anyway. When nothing else is left, loopback.
//!
//! **Addresses**: one per interface, IPv4 first, else a global or unique-local IPv6 address
//! (link-local IPv6 addresses need a scope that other hosts do not share, and are skipped).
//! The interface that reaches the rendezvous store comes first (the caller orders them): its
//! rail carries the ordered traffic.

use std::ffi::CStr;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::error::{Error, Result};

/// Name prefixes of virtual bridges left out of the default choice.
const VIRTUAL_BRIDGES: [&str; 5] = ["docker", "virbr", "br-", "lxcbr", "cni"];

/// A parsed `HCOMM_SOCKET_IFNAME`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct IfSpec {
    /// `^`: the names are excluded (else selected).
    exclude: bool,
    /// `=`: the names are exact (else prefixes).
    exact: bool,
    /// The names, never empty.
    names: Vec<String>,
}

impl IfSpec {
    /// Parses a value of `HCOMM_SOCKET_IFNAME`; `None` for an empty one (the default applies).
    pub(crate) fn parse(value: &str) -> Result<Option<IfSpec>> {
        let mut rest = value.trim();
        let exclude = rest.starts_with('^');
        if exclude {
            rest = &rest[1..];
        }
        let exact = rest.starts_with('=');
        if exact {
            rest = &rest[1..];
        }
        let names: Vec<String> = rest
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(str::to_string)
            .collect();
        if names.is_empty() {
            if exclude || exact {
                return Err(Error::invalid_argument(format!(
                    "HCOMM_SOCKET_IFNAME={value:?} names no interface after its `^` or `=`"
                )));
            }
            return Ok(None);
        }
        if let Some(bad) = names.iter().find(|n| n.contains(['^', '='])) {
            return Err(Error::invalid_argument(format!(
                "HCOMM_SOCKET_IFNAME={value:?}: {bad:?} is not an interface name (`^` and `=` \
                 go once, at the start of the list)"
            )));
        }
        Ok(Some(IfSpec {
            exclude,
            exact,
            names,
        }))
    }

    /// Whether the interface `name` is selected.
    pub(crate) fn selects(&self, name: &str) -> bool {
        let listed = self.names.iter().any(|n| {
            if self.exact {
                name == n
            } else {
                name.starts_with(n.as_str())
            }
        });
        listed != self.exclude
    }
}

/// One interface that is up, with the address a rank announces on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Interface {
    /// Its name (`eth0`).
    pub name: String,
    /// The address announced on it.
    pub addr: IpAddr,
    /// It is a loopback interface.
    pub loopback: bool,
}

/// Whether an address can be announced to other hosts: not unspecified, not multicast, and
/// for IPv6 not link-local.
fn usable(addr: &IpAddr) -> bool {
    match addr {
        IpAddr::V4(a) => !a.is_unspecified() && !a.is_multicast() && !a.is_broadcast(),
        IpAddr::V6(a) => {
            !a.is_unspecified() && !a.is_multicast() && (a.segments()[0] & 0xffc0) != 0xfe80
        }
    }
}

/// Every interface that is up and has a usable address, in the system's order, with its
/// first IPv4 address, else its first usable IPv6 one.
pub(crate) fn up_interfaces() -> Result<Vec<Interface>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list it allocated to `head`, a live local; it is freed
    // below with freeifaddrs, once, and not read afterwards.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(Error::transport(
            "listing the network interfaces",
            std::io::Error::last_os_error(),
        ));
    }
    let mut found: Vec<Interface> = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, not yet freed.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        let flags = ifa.ifa_flags;
        if flags & libc::IFF_UP as u32 == 0 || ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: a non-null ifa_addr points to a sockaddr of the family it names, which
        // getifaddrs allocated with the node; the reads below are of that family's struct.
        let addr = unsafe {
            match i32::from((*ifa.ifa_addr).sa_family) {
                libc::AF_INET => {
                    let sin = &*(ifa.ifa_addr as *const libc::sockaddr_in);
                    IpAddr::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)))
                }
                libc::AF_INET6 => {
                    let sin6 = &*(ifa.ifa_addr as *const libc::sockaddr_in6);
                    IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr))
                }
                _ => continue,
            }
        };
        if !usable(&addr) {
            continue;
        }
        // SAFETY: ifa_name is a NUL-terminated string owned by the list, checked non-null.
        let name = unsafe { CStr::from_ptr(ifa.ifa_name) }
            .to_string_lossy()
            .into_owned();
        let iface = Interface {
            name,
            addr,
            loopback: flags & libc::IFF_LOOPBACK as u32 != 0,
        };
        match found.iter_mut().find(|i| i.name == iface.name) {
            Some(known) if known.addr.is_ipv6() && addr.is_ipv4() => *known = iface,
            Some(_) => {}
            None => found.push(iface),
        }
    }
    // SAFETY: `head` came from getifaddrs above and is freed once; no node is used after.
    unsafe { libc::freeifaddrs(head) };
    Ok(found)
}

/// The interfaces a rank uses among `all` (the up ones), in their order: those `spec`
/// selects, or the default choice (see the module docs). Nothing chosen is an error naming
/// what is up.
pub(crate) fn select(spec: Option<&IfSpec>, all: &[Interface]) -> Result<Vec<Interface>> {
    let chosen: Vec<Interface> = match spec {
        Some(spec) => all
            .iter()
            .filter(|i| spec.selects(&i.name))
            .cloned()
            .collect(),
        None => {
            let real: Vec<Interface> = all
                .iter()
                .filter(|i| !i.loopback && !VIRTUAL_BRIDGES.iter().any(|p| i.name.starts_with(p)))
                .cloned()
                .collect();
            if real.is_empty() {
                all.iter().filter(|i| i.loopback).cloned().collect()
            } else {
                real
            }
        }
    };
    if chosen.is_empty() {
        let up: Vec<String> = all
            .iter()
            .map(|i| format!("{} ({})", i.name, i.addr))
            .collect();
        let what = match spec {
            Some(_) => "HCOMM_SOCKET_IFNAME matches no interface that is up with an address",
            None => "no network interface is up with an address",
        };
        return Err(Error::init(format!(
            "{what}; up: {}: set HCOMM_SOCKET_IFNAME to some of them (NCCL's syntax: \
             prefixes, `^` excludes, `=` exact names)",
            if up.is_empty() {
                "none".to_string()
            } else {
                up.join(", ")
            }
        )));
    }
    Ok(chosen)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iface(name: &str, addr: &str) -> Interface {
        Interface {
            name: name.into(),
            addr: addr.parse().unwrap(),
            loopback: name == "lo",
        }
    }

    /// The interfaces of the netns tests' hosts (two rails), plus a bridge and a v6 one.
    fn host() -> Vec<Interface> {
        vec![
            iface("lo", "127.0.0.1"),
            iface("r0", "10.90.0.1"),
            iface("r1", "10.90.1.1"),
            iface("docker0", "172.17.0.1"),
            iface("ib6", "fd00::5"),
        ]
    }

    fn names(spec: &str) -> Result<Vec<String>> {
        let spec = IfSpec::parse(spec)?;
        let chosen = select(spec.as_ref(), &host())?;
        Ok(chosen.into_iter().map(|i| i.name).collect())
    }

    /// The cases issue 16 lists: `^lo`, `=r0`, `r`, `^=r1`, `r0,r1`, empty, no match.
    #[test]
    fn ifname_selects_like_nccl() {
        assert_eq!(names("^lo").unwrap(), ["r0", "r1", "docker0", "ib6"]);
        assert_eq!(names("=r0").unwrap(), ["r0"]);
        assert_eq!(names("r").unwrap(), ["r0", "r1"]);
        assert_eq!(names("^=r1").unwrap(), ["lo", "r0", "docker0", "ib6"]);
        assert_eq!(names("r0,r1").unwrap(), ["r0", "r1"]);
        assert_eq!(names(" r1 , r0 ").unwrap(), ["r0", "r1"]);
        // Empty: the default, every real interface (no loopback, no bridge).
        assert_eq!(names("").unwrap(), ["r0", "r1", "ib6"]);
        assert_eq!(names(" , ").unwrap(), ["r0", "r1", "ib6"]);
        // Exact is exact: `=r` matches neither rail.
        let e = names("=r").unwrap_err().to_string();
        assert!(e.contains("matches no interface"), "{e}");
        assert!(
            e.contains("r0 (10.90.0.1)") && e.contains("lo (127.0.0.1)"),
            "{e}"
        );
        assert!(names("eth").is_err());
    }

    #[test]
    fn ifname_rejects_misplaced_operators() {
        for bad in ["^", "=", "^=", "r0,^r1", "r0,=r1", "=^r0"] {
            assert!(IfSpec::parse(bad).is_err(), "{bad}");
        }
        let spec = IfSpec::parse("^=r1").unwrap().unwrap();
        assert!(spec.exclude && spec.exact && spec.names == ["r1"]);
    }

    /// Only loopback up: it is the default (one host, no network); a selection that names
    /// it works too.
    #[test]
    fn loopback_is_the_default_only_when_nothing_else_is_up() {
        let lo = [iface("lo", "127.0.0.1"), iface("docker0", "172.17.0.1")];
        let chosen = select(None, &lo).unwrap();
        assert_eq!(chosen.len(), 1);
        assert_eq!(chosen[0].name, "lo");
        assert!(select(None, &[]).is_err());
    }

    #[test]
    fn link_local_ipv6_is_not_announced() {
        assert!(!usable(&"fe80::1".parse().unwrap()));
        assert!(usable(&"fd00::2".parse().unwrap()));
        assert!(usable(&"2001:db8::1".parse().unwrap()));
        assert!(!usable(&"0.0.0.0".parse().unwrap()));
    }

    /// The machine's own interfaces list without error, loopback among them where it is up.
    #[test]
    fn this_machine_lists_its_interfaces() {
        let all = up_interfaces().unwrap();
        assert!(all.iter().all(|i| usable(&i.addr)));
        assert!(select(None, &all).is_ok() || all.is_empty());
    }
}
