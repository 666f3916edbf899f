//! Bootstrap: how the ranks of a job find and trust each other.
//!
//! Rank 0 (or the launcher) runs a [`RendezvousStore`], a small authenticated TCP key/value
//! service; every rank connects a [`StoreClient`] to it (`HCOMM_ROOT_ADDR`) and exchanges
//! addresses and topology through it. Every connection, to the store or between ranks, starts
//! with the mutual challenge–response handshake of [`auth`], keyed by the job secret
//! (`HCOMM_JOB_SECRET`), so a process without the secret cannot join.
//!
//! All socket I/O here is bounded by a deadline: a silent or slow peer costs a timeout, never
//! a hang.

pub(crate) mod auth;
pub(crate) mod store;

pub use store::{RendezvousStore, StoreClient};

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::error::Result;

/// One step of the init exchange: publishes `mine` as `{prefix}/{rank}`, then returns what
/// every rank of `ranks` published under `prefix` (in the order of `ranks`, this rank's own
/// included), waiting until `deadline` for the slow ones.
///
/// Two store round trips, whatever the number of ranks: the store waits for the whole set and
/// answers with all of it ([`StoreClient::wait_all`]). Errors: those of the store client; a
/// timeout names the ranks that never published.
pub(crate) fn exchange(
    client: &mut StoreClient,
    prefix: &str,
    rank: usize,
    mine: &[u8],
    ranks: &[usize],
    deadline: Instant,
) -> Result<Vec<Vec<u8>>> {
    client.set(&format!("{prefix}/{rank}"), mine)?;
    let left = deadline.saturating_duration_since(Instant::now());
    client.wait_all(&format!("{prefix}/"), ranks, left)
}

/// A byte stream whose reads and writes wait at most a given time: a TCP socket, or in tests
/// an in-memory stream through which the fuzz harnesses feed the decoders their input.
pub(crate) trait TimedStream {
    /// Reads some bytes into `buf`, waiting at most `timeout`, as [`Read::read`] does (`Ok(0)`
    /// at the end of the stream); nothing in time is a `WouldBlock` or `TimedOut` error.
    fn read_within(&self, buf: &mut [u8], timeout: Duration) -> io::Result<usize>;
    /// Writes some of `buf`, waiting at most `timeout`, as [`Write::write`] does.
    fn write_within(&self, buf: &[u8], timeout: Duration) -> io::Result<usize>;
}

impl TimedStream for TcpStream {
    fn read_within(&self, buf: &mut [u8], timeout: Duration) -> io::Result<usize> {
        self.set_read_timeout(Some(timeout))?;
        let mut stream = self;
        stream.read(buf)
    }

    fn write_within(&self, buf: &[u8], timeout: Duration) -> io::Result<usize> {
        self.set_write_timeout(Some(timeout))?;
        let mut stream = self;
        stream.write(buf)
    }
}

/// Time left until `deadline`, or a `TimedOut` error when it has passed.
fn remaining(deadline: Instant) -> io::Result<Duration> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        Err(io::Error::new(io::ErrorKind::TimedOut, "deadline passed"))
    } else {
        Ok(left)
    }
}

/// True for the errors a socket timeout produces (`WouldBlock` on Unix, `TimedOut` elsewhere).
fn is_timeout(err: &io::Error) -> bool {
    matches!(
        err.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// Fills `buf` from `stream` before `deadline`.
///
/// Unlike `read_exact` with a socket timeout, the deadline bounds the whole read: a peer that
/// trickles one byte at a time cannot stretch it. Errors: `TimedOut` when the deadline passes,
/// `UnexpectedEof` when the peer closes first.
pub(crate) fn read_exact_until<S: TimedStream + ?Sized>(
    stream: &S,
    mut buf: &mut [u8],
    deadline: Instant,
) -> io::Result<()> {
    while !buf.is_empty() {
        match stream.read_within(buf, remaining(deadline)?) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => buf = &mut buf[n..],
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if is_timeout(&e) => return Err(io::ErrorKind::TimedOut.into()),
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Reads exactly `len` bytes before `deadline` into a new vector.
///
/// The vector grows as data arrives, so a length announced by a peer that then sends nothing
/// costs no memory.
pub(crate) fn read_vec_until<S: TimedStream + ?Sized>(
    stream: &S,
    len: usize,
    deadline: Instant,
) -> io::Result<Vec<u8>> {
    const STEP: usize = 64 * 1024;
    let mut out = Vec::with_capacity(len.min(STEP));
    while out.len() < len {
        let have = out.len();
        out.resize(have + (len - have).min(STEP), 0);
        match stream.read_within(&mut out[have..], remaining(deadline)?) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => out.truncate(have + n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => out.truncate(have),
            Err(e) if is_timeout(&e) => return Err(io::ErrorKind::TimedOut.into()),
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// Writes all of `buf` to `stream` before `deadline` (a peer that stops reading cannot block
/// the writer for longer).
pub(crate) fn write_all_until<S: TimedStream + ?Sized>(
    stream: &S,
    mut buf: &[u8],
    deadline: Instant,
) -> io::Result<()> {
    while !buf.is_empty() {
        match stream.write_within(buf, remaining(deadline)?) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if is_timeout(&e) => return Err(io::ErrorKind::TimedOut.into()),
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// An in-memory stream for the fuzz harnesses: reads hand out `input` in pieces of at most
/// `chunk` bytes, then report the end of the stream; writes are collected.
#[cfg(test)]
pub(crate) struct MemStream<'a> {
    input: &'a [u8],
    pos: std::cell::Cell<usize>,
    chunk: usize,
    output: std::cell::RefCell<Vec<u8>>,
}

#[cfg(test)]
impl<'a> MemStream<'a> {
    /// A stream that reads `input`, at most `chunk` (at least 1) bytes per read.
    pub(crate) fn new(input: &'a [u8], chunk: usize) -> MemStream<'a> {
        MemStream {
            input,
            pos: std::cell::Cell::new(0),
            chunk: chunk.max(1),
            output: std::cell::RefCell::new(Vec::new()),
        }
    }

    /// Bytes of the input read so far.
    pub(crate) fn consumed(&self) -> usize {
        self.pos.get()
    }

    /// What was written since the last call.
    pub(crate) fn take_output(&self) -> Vec<u8> {
        self.output.take()
    }
}

#[cfg(test)]
impl TimedStream for MemStream<'_> {
    fn read_within(&self, buf: &mut [u8], _timeout: Duration) -> io::Result<usize> {
        let pos = self.pos.get();
        let n = buf.len().min(self.chunk).min(self.input.len() - pos);
        buf[..n].copy_from_slice(&self.input[pos..pos + n]);
        self.pos.set(pos + n);
        Ok(n)
    }

    fn write_within(&self, buf: &[u8], _timeout: Duration) -> io::Result<usize> {
        self.output.borrow_mut().extend_from_slice(buf);
        Ok(buf.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;
    use std::time::Duration;

    fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (b, _) = listener.accept().unwrap();
        (a, b)
    }

    #[test]
    fn read_exact_until_times_out_on_silence() {
        let (a, _b) = pair();
        let start = Instant::now();
        let mut buf = [0u8; 4];
        let err = read_exact_until(&a, &mut buf, start + Duration::from_millis(100)).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert!(start.elapsed() < Duration::from_secs(2));
    }

    #[test]
    fn read_exact_until_bounds_a_trickling_peer() {
        let (a, b) = pair();
        let writer = std::thread::spawn(move || {
            for _ in 0..20 {
                if (&b).write_all(b"x").is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        let start = Instant::now();
        let mut buf = [0u8; 100];
        let err = read_exact_until(&a, &mut buf, start + Duration::from_millis(200)).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert!(start.elapsed() < Duration::from_millis(900));
        drop(a);
        writer.join().unwrap();
    }

    #[test]
    fn read_vec_until_reports_eof_without_allocating_the_claim() {
        let (a, b) = pair();
        (&b).write_all(b"abc").unwrap();
        drop(b);
        let deadline = Instant::now() + Duration::from_secs(5);
        let err = read_vec_until(&a, 1 << 30, deadline).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn read_vec_until_reads_exactly() {
        let (a, b) = pair();
        let data: Vec<u8> = (0..100_000u32).map(|i| i as u8).collect();
        let sent = data.clone();
        let writer = std::thread::spawn(move || {
            write_all_until(&b, &sent, Instant::now() + Duration::from_secs(5)).unwrap();
            (&b).write_all(b"rest").unwrap();
        });
        let got = read_vec_until(&a, data.len(), Instant::now() + Duration::from_secs(5)).unwrap();
        assert_eq!(got, data);
        writer.join().unwrap();
        let mut rest = [0u8; 4];
        read_exact_until(&a, &mut rest, Instant::now() + Duration::from_secs(5)).unwrap();
        assert_eq!(&rest, b"rest");
    }
}
