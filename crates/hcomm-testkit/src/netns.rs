//! Network namespaces as hosts: the `ip` command, whether this process may make namespaces,
//! names unique to a test run, the sweep of namespaces left by test processes that died, and
//! [`Hosts`]: namespaces on one bridge that jobs of ranks run across.

use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Runs `ip args`; the error output when it fails.
pub fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip {}: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Whether this process can make network namespaces (root, and `ip` installed); when not,
/// prints that `test` is skipped, and why.
pub fn can_make_namespaces(test: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        println!("{test}: skipped: network namespaces need root");
        return false;
    }
    if Command::new("ip").arg("-V").output().is_err() {
        println!("{test}: skipped: no `ip` command (iproute2)");
        return false;
    }
    sweep_stale();
    true
}

/// Whether libfabric loads here (`HCOMM_OFI_LIB`, by default `libfabric.so.1`, as hcomm
/// loads it); when not, prints that `test` is skipped, and why.
pub fn libfabric_loads(test: &str) -> bool {
    let lib = std::env::var("HCOMM_OFI_LIB").unwrap_or_else(|_| "libfabric.so.1".into());
    let Ok(name) = std::ffi::CString::new(lib.as_str()) else {
        println!("{test}: skipped: HCOMM_OFI_LIB={lib:?} is no library name");
        return false;
    };
    // SAFETY: dlopen of a NUL-terminated name; the handle is closed at once.
    let handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if handle.is_null() {
        println!("{test}: skipped: libfabric ({lib}) is not installed");
        return false;
    }
    // SAFETY: a handle dlopen returned, closed once.
    unsafe { libc::dlclose(handle) };
    true
}

/// A prefix of namespace names unique to this process and call: `hct<pid>-<n>`.
pub fn unique_prefix() -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    format!(
        "hct{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Removes the namespaces of test processes that are gone (killed before they could clean
/// up, by a test timeout say): names `hct<pid>-...` whose process no longer exists.
fn sweep_stale() {
    let Ok(entries) = std::fs::read_dir("/run/netns") else {
        return;
    };
    for name in entries
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
    {
        let pid = name
            .strip_prefix("hct")
            .and_then(|rest| rest.split('-').next());
        if pid.is_some_and(|p| !std::path::Path::new(&format!("/proc/{p}")).exists()) {
            let _ = ip(&["netns", "del", &name]);
        }
    }
}

/// Reads a counter of interface `dev` in namespace `ns`
/// (`/sys/class/net/DEV/statistics/NAME`); 0 when it cannot be read.
pub fn counter(ns: &str, dev: &str, name: &str) -> u64 {
    let path = format!("/sys/class/net/{dev}/statistics/{name}");
    Command::new("ip")
        .args(["netns", "exec", ns, "cat", &path])
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(0)
}

/// Runs `f` on a thread of its own in namespace `ns` (its sockets are that namespace's).
pub fn run_in<T: Send>(ns: &str, f: impl FnOnce() -> T + Send) -> Result<T, String> {
    std::thread::scope(|scope| {
        scope
            .spawn(|| wire::enter(ns).map(|()| f()))
            .join()
            .map_err(|_| format!("the thread in {ns} panicked"))?
    })
}

/// A wire with a delay, where the kernel has no `netem` qdisc to add one (`sch_netem`): a
/// thread in a middle namespace reads every frame from each of two interfaces with a raw
/// packet socket and writes it out of the other `delay` later, in order (an Ethernet hub
/// with a delay line). Hosts joined through it see a link whose round trip is twice the
/// delay. Stopped when dropped.
///
/// Frames a host's kernel hands over with their TCP or UDP checksum left to the interface
/// (veth offloads it) get it computed here, as a NIC would; so the interfaces on both sides
/// take frames of any size up to their MTU, the hosts' segmentation offload included.
pub struct Delay {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    forwarded: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl Delay {
    /// Starts forwarding between interfaces `ends` of namespace `ns`, each frame `delay`
    /// after it came.
    pub fn start(ns: &str, ends: [&str; 2], delay: std::time::Duration) -> Result<Delay, String> {
        use std::sync::atomic::AtomicBool;
        use std::sync::Arc;
        let stop = Arc::new(AtomicBool::new(false));
        let forwarded = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let (ready, opened) = std::sync::mpsc::channel();
        let (ns, ends) = (ns.to_string(), ends.map(str::to_string));
        let (halt, count) = (Arc::clone(&stop), Arc::clone(&forwarded));
        let thread = std::thread::Builder::new()
            .name("delay-line".into())
            .spawn(move || match wire::open(&ns, &ends) {
                Ok(socks) => {
                    let _ = ready.send(Ok(()));
                    wire::forward(&socks, delay, &halt, &count);
                }
                Err(e) => {
                    let _ = ready.send(Err(e));
                }
            })
            .map_err(|e| format!("starting the delay line: {e}"))?;
        let delay = Delay {
            stop,
            thread: Some(thread),
            forwarded,
        };
        opened
            .recv_timeout(std::time::Duration::from_secs(10))
            .map_err(|e| format!("the delay line did not start: {e}"))??;
        Ok(delay)
    }

    /// Frames forwarded so far.
    pub fn forwarded(&self) -> u64 {
        self.forwarded.load(Ordering::Relaxed)
    }
}

impl Drop for Delay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The raw packet sockets of [`Delay`].
mod wire {
    use std::collections::VecDeque;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::time::{Duration, Instant};

    /// Bytes of the largest frame read (an interface's MTU, 65535 at most, and its header).
    const FRAME: usize = 65536 + 64;
    /// Bytes of each packet socket's buffers.
    const SOCKET_BUFFER: libc::c_int = 64 << 20;
    /// How long the thread sleeps at most between looks at its stop flag.
    const TICK: Duration = Duration::from_millis(20);

    /// Moves this thread into network namespace `ns`.
    pub(super) fn enter(ns: &str) -> Result<(), String> {
        let file = std::fs::File::open(format!("/run/netns/{ns}"))
            .map_err(|e| format!("opening namespace {ns}: {e}"))?;
        // SAFETY: setns on an open namespace descriptor changes only this thread's namespace.
        if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(format!(
                "entering {ns}: {}",
                std::io::Error::last_os_error()
            ));
        }
        Ok(())
    }

    /// Enters namespace `ns` (this thread only) and opens a packet socket on each of `ends`.
    pub(super) fn open(ns: &str, ends: &[String; 2]) -> Result<[OwnedFd; 2], String> {
        enter(ns)?;
        let open = |name: &String| -> Result<OwnedFd, String> {
            let cname = std::ffi::CString::new(name.as_str()).map_err(|e| e.to_string())?;
            // SAFETY: a valid C string.
            let index = unsafe { libc::if_nametoindex(cname.as_ptr()) };
            if index == 0 {
                return Err(format!("no interface {name} in {ns}"));
            }
            let all = (libc::ETH_P_ALL as u16).to_be();
            // SAFETY: plain socket creation; the descriptor is owned below.
            let fd = unsafe {
                libc::socket(
                    libc::AF_PACKET,
                    libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                    i32::from(all),
                )
            };
            if fd < 0 {
                return Err(format!(
                    "packet socket: {}",
                    std::io::Error::last_os_error()
                ));
            }
            // SAFETY: `fd` is a new descriptor nobody else owns.
            let sock = unsafe { OwnedFd::from_raw_fd(fd) };
            // SAFETY: sockaddr_ll is plain data; all zeros is a valid value.
            let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
            addr.sll_family = libc::AF_PACKET as u16;
            addr.sll_protocol = all;
            addr.sll_ifindex = index as i32;
            // SAFETY: `addr` is a sockaddr_ll of the size given.
            let bound = unsafe {
                libc::bind(
                    sock.as_raw_fd(),
                    std::ptr::from_ref(&addr).cast(),
                    std::mem::size_of::<libc::sockaddr_ll>() as u32,
                )
            };
            if bound != 0 {
                return Err(format!(
                    "binding to {name}: {}",
                    std::io::Error::last_os_error()
                ));
            }
            // Room for the frames that come while the thread waits for a core (a full
            // socket drops them, and TCP over a long round trip recovers slowly).
            for opt in [libc::SO_RCVBUFFORCE, libc::SO_SNDBUFFORCE] {
                let bytes: libc::c_int = SOCKET_BUFFER;
                // SAFETY: an int option of the size given.
                unsafe {
                    libc::setsockopt(
                        sock.as_raw_fd(),
                        libc::SOL_SOCKET,
                        opt,
                        std::ptr::from_ref(&bytes).cast(),
                        std::mem::size_of::<libc::c_int>() as u32,
                    )
                };
            }
            Ok(sock)
        };
        Ok([open(&ends[0])?, open(&ends[1])?])
    }

    /// Forwards frames between the two sockets, each `delay` after it came, until `stop`.
    pub(super) fn forward(
        socks: &[OwnedFd; 2],
        delay: Duration,
        stop: &AtomicBool,
        count: &AtomicU64,
    ) {
        let mut lines: [VecDeque<(Instant, Vec<u8>)>; 2] = Default::default();
        let mut buf = vec![0u8; FRAME];
        while !stop.load(Ordering::Relaxed) {
            let now = Instant::now();
            let next = lines
                .iter()
                .filter_map(|l| l.front().map(|f| f.0))
                .min()
                .map_or(TICK, |due| due.saturating_duration_since(now).min(TICK));
            let mut fds = socks.each_ref().map(|s| libc::pollfd {
                fd: s.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            });
            let ms = i32::try_from(next.as_millis()).unwrap_or(i32::MAX);
            // SAFETY: two valid pollfd entries.
            unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) };
            for (i, sock) in socks.iter().enumerate() {
                while let Some(n) = receive(sock, &mut buf) {
                    let mut frame = buf[..n].to_vec();
                    fill_checksum(&mut frame);
                    lines[i].push_back((Instant::now() + delay, frame));
                }
            }
            let now = Instant::now();
            for (i, line) in lines.iter_mut().enumerate() {
                while line.front().is_some_and(|f| f.0 <= now) {
                    let Some((_, frame)) = line.pop_front() else {
                        break;
                    };
                    // SAFETY: `frame` is a valid buffer of its length.
                    let sent = unsafe {
                        libc::send(
                            socks[1 - i].as_raw_fd(),
                            frame.as_ptr().cast(),
                            frame.len(),
                            0,
                        )
                    };
                    if sent > 0 {
                        count.fetch_add(1, Ordering::Relaxed);
                    } else {
                        eprintln!(
                            "delay line: {} B: {}",
                            frame.len(),
                            std::io::Error::last_os_error()
                        );
                    }
                }
            }
        }
    }

    /// The next frame that came in on `sock` (not one it sent), its length; `None` when none
    /// waits.
    fn receive(sock: &OwnedFd, buf: &mut [u8]) -> Option<usize> {
        loop {
            // SAFETY: sockaddr_ll is plain data; all zeros is a valid value.
            let mut from: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
            let mut len = std::mem::size_of::<libc::sockaddr_ll>() as u32;
            // SAFETY: `buf` and `from` are valid for the sizes given.
            let n = unsafe {
                libc::recvfrom(
                    sock.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    0,
                    std::ptr::from_mut(&mut from).cast(),
                    &mut len,
                )
            };
            if n <= 0 {
                return None;
            }
            if from.sll_pkttype != libc::PACKET_OUTGOING {
                return Some(n as usize);
            }
        }
    }

    /// Computes the TCP or UDP checksum of an IPv4 frame (the sending kernel may have left it
    /// to the interface).
    fn fill_checksum(frame: &mut [u8]) {
        const ETH: usize = 14;
        if frame.len() < ETH + 20 || frame[12..14] != [0x08, 0x00] {
            return;
        }
        let ip = &frame[ETH..];
        let ihl = usize::from(ip[0] & 0x0f) * 4;
        let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
        let proto = ip[9];
        let at = match proto {
            6 => 16,
            17 => 6,
            _ => return,
        };
        // Fragments other than the first carry no header to fill.
        let fragment = u16::from_be_bytes([ip[6], ip[7]]) & 0x1fff;
        if ihl < 20 || total < ihl + at + 2 || ETH + total > frame.len() || fragment != 0 {
            return;
        }
        let len = total - ihl;
        let mut sum: u32 = 0;
        let mut add = |b: &[u8]| {
            for pair in b.chunks(2) {
                let hi = u32::from(pair[0]) << 8;
                sum += hi | pair.get(1).map_or(0, |&lo| u32::from(lo));
            }
        };
        add(&ip[12..20]);
        add(&[0, proto]);
        add(&(len as u16).to_be_bytes());
        let seg = ETH + ihl;
        frame[seg + at] = 0;
        frame[seg + at + 1] = 0;
        add(&frame[seg..seg + len]);
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        let mut check = !(sum as u16);
        if proto == 17 && check == 0 {
            check = 0xffff;
        }
        frame[seg + at..seg + at + 2].copy_from_slice(&check.to_be_bytes());
    }
}

/// Ranks per host of [`Hosts::start`].
pub const PER_HOST: usize = 2;
/// Where rank 0, in the first host, serves the rendezvous store.
pub const STORE_PORT: u16 = 29400;

/// Network namespaces ("hosts") on one bridge, removed on drop: two ranks in each "host"
/// (told apart by `HCOMM_HOST_ID`, since namespaces share the hostname and boot id;
/// `/dev/shm` stays shared, as between the ranks of one real host).
pub struct Hosts {
    /// The namespaces' names, host by host.
    pub names: Vec<String>,
}

impl Hosts {
    /// Creates `n` namespaces: the first holds a bridge with 10.77.0.1/24, host `i` a veth
    /// end with 10.77.0.`i + 1` plugged into it. `None`, after saying why, where this process
    /// cannot make namespaces (not root, or no `ip`); where it can, a failure panics.
    pub fn create(test: &str, n: usize) -> Option<Hosts> {
        if !can_make_namespaces(test) {
            return None;
        }
        let job = unique_prefix();
        let mut hosts = Hosts { names: Vec::new() };
        for i in 0..n {
            let name = format!("{job}-h{i}");
            ip(&["netns", "add", &name]).unwrap_or_else(|e| panic!("{e}"));
            hosts.names.push(name);
        }
        hosts.wire().unwrap_or_else(|e| panic!("{e}"));
        Some(hosts)
    }

    fn wire(&self) -> Result<(), String> {
        let first = &self.names[0];
        ip(&["-n", first, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", first, "addr", "add", "10.77.0.1/24", "dev", "br0"])?;
        ip(&["-n", first, "link", "set", "br0", "up"])?;
        for (i, name) in self.names.iter().enumerate() {
            ip(&["-n", name, "link", "set", "lo", "up"])?;
            if i == 0 {
                continue;
            }
            let port = format!("h{i}");
            ip(&[
                "link", "add", &port, "netns", first, "type", "veth", "peer", "name", "eth0",
                "netns", name,
            ])?;
            ip(&["-n", first, "link", "set", &port, "master", "br0"])?;
            ip(&["-n", first, "link", "set", &port, "up"])?;
            let addr = format!("{}/24", self.addr(i));
            ip(&["-n", name, "addr", "add", &addr, "dev", "eth0"])?;
            ip(&["-n", name, "link", "set", "eth0", "up"])?;
        }
        Ok(())
    }

    /// The address of host `i`.
    pub fn addr(&self, i: usize) -> String {
        format!("10.77.0.{}", i + 1)
    }

    /// The rendezvous store's address (rank 0, in the first host).
    pub fn root(&self) -> String {
        format!("{}:{STORE_PORT}", self.addr(0))
    }

    /// `program` in host `i`, announcing it as its host.
    pub fn exec(&self, i: usize, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.names[i], program])
            .env("HCOMM_HOST_ID", &self.names[i]);
        c
    }

    /// Starts `program args` with two ranks in each host, ranks numbered host by host.
    pub fn start(&self, program: &str, args: &[&str], env: &[(&str, &str)]) -> crate::Ranks {
        let n = self.names.len() * PER_HOST;
        crate::Ranks::start(n, Some(&self.root()), args, |r| {
            let mut c = self.exec(r / PER_HOST, program);
            c.env("HCOMM_TIMEOUT", "60");
            for (k, v) in env {
                c.env(k, v);
            }
            c
        })
    }

    /// Bytes host `i`'s interface received so far.
    pub fn rx_bytes(&self, i: usize) -> u64 {
        let dev = if i == 0 { "br0" } else { "eth0" };
        counter(&self.names[i], dev, "rx_bytes")
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        // Deleting a namespace removes its end of every veth pair, and so the pair.
        for name in &self.names {
            if let Err(e) = ip(&["netns", "del", name]) {
                eprintln!("cleanup: {e}");
            }
        }
    }
}
