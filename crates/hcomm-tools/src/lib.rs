//! Helpers shared by the hcomm operator tools (`hcommrun` and friends).
//!
//! Kept in the library so that they can be unit-tested without starting processes.

use std::io::{self, BufRead, Write};

pub mod bind;
pub mod pattern;
pub mod plot;

/// Number of random bytes in a job secret made by [`generate_job_secret`].
pub const JOB_SECRET_BYTES: usize = 32;

/// Makes a fresh job secret: [`JOB_SECRET_BYTES`] random bytes from the OS, as lowercase hex.
///
/// The library uses the bytes of the `HCOMM_JOB_SECRET` string as the key, so the hex text
/// itself is the secret; hex keeps it printable and safe to pass through the environment.
pub fn generate_job_secret() -> io::Result<String> {
    let mut bytes = [0u8; JOB_SECRET_BYTES];
    getrandom::fill(&mut bytes)
        .map_err(|e| io::Error::other(format!("cannot get random bytes from the OS: {e}")))?;
    Ok(hex::encode(bytes))
}

/// The conventional name of a Unix signal number (`SIGKILL` for 9), or `SIG<n>` for numbers
/// this table does not know (real-time signals, for instance).
pub fn signal_name(sig: i32) -> String {
    let name = match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGCHLD => "SIGCHLD",
        libc::SIGCONT => "SIGCONT",
        libc::SIGSTOP => "SIGSTOP",
        libc::SIGTSTP => "SIGTSTP",
        libc::SIGTTIN => "SIGTTIN",
        libc::SIGTTOU => "SIGTTOU",
        libc::SIGURG => "SIGURG",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGXFSZ => "SIGXFSZ",
        libc::SIGVTALRM => "SIGVTALRM",
        libc::SIGPROF => "SIGPROF",
        libc::SIGWINCH => "SIGWINCH",
        libc::SIGIO => "SIGIO",
        libc::SIGSYS => "SIGSYS",
        _ => return format!("SIG{sig}"),
    };
    name.to_string()
}

/// Copies `input` to `output` line by line, putting `prefix` in front of every line.
///
/// Each line goes to `output` as one `write_all` of prefix, bytes and newline, so that a
/// writer shared between threads (a locked stdout) never mixes two lines. A last line without
/// a newline gets one; bytes that are not UTF-8 pass through unchanged. `output` is called
/// once per line, so the caller can take a lock for just that line.
///
/// Returns the number of lines copied. Read errors end the copy with that error. After a
/// write error the remaining input is still read (and dropped), so that the process writing
/// into `input` never blocks on a full pipe; the first write error is returned at the end.
pub fn copy_prefixed_lines<R, F>(mut input: R, prefix: &[u8], mut output: F) -> io::Result<u64>
where
    R: BufRead,
    F: FnMut(&[u8]) -> io::Result<()>,
{
    let mut line = Vec::with_capacity(256);
    let mut lines = 0u64;
    let mut write_error = None;
    loop {
        line.clear();
        line.extend_from_slice(prefix);
        let n = input.read_until(b'\n', &mut line)?;
        if n == 0 {
            break;
        }
        if line.last() != Some(&b'\n') {
            line.push(b'\n');
        }
        lines += 1;
        if write_error.is_none() {
            if let Err(e) = output(&line) {
                write_error = Some(e);
            }
        }
    }
    match write_error {
        Some(e) => Err(e),
        None => Ok(lines),
    }
}

/// Writes one whole line to a locked stream and flushes it, for use as the `output` of
/// [`copy_prefixed_lines`].
pub fn write_line_locked<W: Write>(mut stream: W, line: &[u8]) -> io::Result<()> {
    stream.write_all(line)?;
    stream.flush()
}

/// Parses a byte count: digits with an optional K, M, G or T suffix (powers of 1024),
/// optionally followed by `B` or `iB` (`64K`, `16MiB`, `128m`).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, suffix) = t.split_at(digits);
    if num.is_empty() {
        return Err(format!(
            "{s:?} is not a size: expected digits, e.g. 8, 64K, 16M"
        ));
    }
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is too large for a size"))?;
    let upper = suffix.to_ascii_uppercase();
    let unit = upper
        .strip_suffix("IB")
        .or_else(|| upper.strip_suffix('B'))
        .unwrap_or(&upper);
    let shift = match unit {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        _ => {
            return Err(format!(
                "{s:?} has an unknown unit: use K, M, G or T (powers of 1024)"
            ))
        }
    };
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("{s:?} is too large for a size"))
}

/// A zeroed buffer of `size` bytes, or an error instead of an abort when memory is short.
pub fn alloc_zeroed(size: usize) -> io::Result<Vec<u8>> {
    let mut v = Vec::new();
    v.try_reserve_exact(size)
        .map_err(|e| io::Error::other(format!("cannot allocate a {size}-byte buffer: {e}")))?;
    v.resize(size, 0);
    Ok(v)
}

/// Appends the test element with seed `x` (any u64) to `out`: a small integer (±1 for
/// products), so that float reductions are exact in any order and results compare bit for
/// bit; integers get a spread of bit patterns. Every rank generates every rank's input
/// with it, so checks need no extra communication.
pub fn push_test_value(dtype: hcomm::DataType, op: hcomm::ReduceOp, x: u64, out: &mut Vec<u8>) {
    use hcomm::DataType;
    let x = x % 7;
    let v: i64 = match op {
        hcomm::ReduceOp::Prod if x % 2 == 0 => 1,
        hcomm::ReduceOp::Prod => -1,
        _ => x as i64 - 3,
    };
    match dtype {
        DataType::Float32 => out.extend_from_slice(&(v as f32).to_le_bytes()),
        DataType::Float64 => out.extend_from_slice(&(v as f64).to_le_bytes()),
        DataType::Float16 => out.extend_from_slice(&half::f16::from_f32(v as f32).to_le_bytes()),
        DataType::Bfloat16 => out.extend_from_slice(&half::bf16::from_f32(v as f32).to_le_bytes()),
        _ => {
            let bits = (v as u64)
                .wrapping_mul(0x9e37_79b9_7f4a_7c15 | x)
                .to_le_bytes();
            out.extend_from_slice(&bits[..dtype.size()]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prefixed(input: &[u8], prefix: &[u8]) -> (Vec<u8>, u64) {
        let mut out = Vec::new();
        let n = copy_prefixed_lines(input, prefix, |l| {
            out.push(l.to_vec());
            Ok(())
        })
        .unwrap();
        // Every call must be exactly one line.
        for l in &out {
            assert_eq!(l.iter().filter(|&&b| b == b'\n').count(), 1);
            assert!(l.ends_with(b"\n"));
        }
        (out.concat(), n)
    }

    #[test]
    fn prefixes_every_line() {
        let (out, n) = prefixed(b"a\nbb\n\nccc\n", b"[3] ");
        assert_eq!(out, b"[3] a\n[3] bb\n[3] \n[3] ccc\n");
        assert_eq!(n, 4);
    }

    #[test]
    fn last_line_without_newline_is_kept() {
        let (out, n) = prefixed(b"one\ntwo", b"[0] ");
        assert_eq!(out, b"[0] one\n[0] two\n");
        assert_eq!(n, 2);
    }

    #[test]
    fn empty_input_gives_nothing() {
        let (out, n) = prefixed(b"", b"[0] ");
        assert!(out.is_empty());
        assert_eq!(n, 0);
    }

    #[test]
    fn non_utf8_passes_through() {
        let (out, _) = prefixed(b"\xff\xfe\x00x\n\xc3", b"[1] ");
        assert_eq!(out, b"[1] \xff\xfe\x00x\n[1] \xc3\n");
    }

    #[test]
    fn long_lines_stay_whole() {
        let long = vec![b'x'; 100_000];
        let mut input = long.clone();
        input.push(b'\n');
        input.extend_from_slice(&long);
        let reader = io::BufReader::with_capacity(16, &input[..]);
        let mut calls = 0;
        copy_prefixed_lines(reader, b"[7] ", |l| {
            calls += 1;
            assert_eq!(l.len(), 4 + 100_000 + 1);
            Ok(())
        })
        .unwrap();
        assert_eq!(calls, 2);
    }

    #[test]
    fn write_error_keeps_draining() {
        let mut calls = 0;
        let err = copy_prefixed_lines(&b"a\nb\nc\n"[..], b"", |_| {
            calls += 1;
            Err(io::Error::from(io::ErrorKind::BrokenPipe))
        })
        .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::BrokenPipe);
        assert_eq!(calls, 1);
    }

    #[test]
    fn sizes_parse_with_binary_suffixes() {
        assert_eq!(parse_size("8"), Ok(8));
        assert_eq!(parse_size("64K"), Ok(64 << 10));
        assert_eq!(parse_size("16M"), Ok(16 << 20));
        assert_eq!(parse_size("128m"), Ok(128 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("4KiB"), Ok(4096));
        assert_eq!(parse_size("2MB"), Ok(2 << 20));
        assert!(parse_size("").is_err());
        assert!(parse_size("K").is_err());
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("-1").is_err());
        assert!(parse_size("99999999999999999999").is_err());
        assert!(parse_size("99999999999T").is_err());
    }

    #[test]
    fn secrets_are_fresh_hex() {
        let a = generate_job_secret().unwrap();
        let b = generate_job_secret().unwrap();
        assert_eq!(a.len(), 2 * JOB_SECRET_BYTES);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }

    #[test]
    fn signal_names() {
        assert_eq!(signal_name(9), "SIGKILL");
        assert_eq!(signal_name(15), "SIGTERM");
        assert_eq!(signal_name(2), "SIGINT");
        assert_eq!(signal_name(1000), "SIG1000");
    }
}
