//! Mutual challenge–response authentication of a TCP connection with the job secret.
//!
//! Both sides prove they hold the secret without sending it: each contributes a fresh random
//! nonce, and each answers with an HMAC-SHA256, keyed by the secret, over the whole exchange
//! (both nonces and both hellos) under a label that differs per direction, so a proof can be
//! neither replayed on another connection nor reflected back to its sender. The client proves
//! itself first, so a listener never hands a MAC to a peer that has not shown the secret.
//!
//! Wire format (integers little-endian):
//!
//! ```text
//! 1. client -> server  MAGIC (8) | VERSION u32 | client nonce (32) | hello len u32 | hello
//! 2. server -> client  MAGIC (8) | VERSION u32 | server nonce (32) | hello len u32 | hello
//! 3. client -> server  client MAC (32)
//! 4. server -> client  ACCEPTED (1) | server MAC (32)     or     REFUSED (1), then close
//!
//! client MAC = HMAC(secret, CLIENT_LABEL | cn | sn | len ch | ch | len sh | sh)
//! server MAC = HMAC(secret, SERVER_LABEL | cn | sn | len ch | ch | len sh | sh)
//! ```
//!
//! The hellos are application payloads (at most [`MAX_HELLO`] bytes each): authenticated, not
//! encrypted. The handshake is generic; the rendezvous store and the TCP transport each put
//! their own protocol name and details in the hellos.

use std::io;
use std::net::TcpStream;
use std::time::Instant;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::{read_exact_until, read_vec_until, write_all_until, TimedStream};
use crate::error::{Error, Result};

/// A secret (the job secret, a join token's key): its bytes are there for authentication,
/// but its `Debug` prints `<redacted>`, so that a configuration, a transport's settings or an
/// error that holds one can be logged without giving it away.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Vec<u8>);

impl Secret {
    /// The secret made of `bytes`.
    pub fn new(bytes: impl Into<Vec<u8>>) -> Secret {
        Secret(bytes.into())
    }

    /// Its bytes, for authentication (never for a message or a log).
    pub fn expose(&self) -> &[u8] {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Largest hello (application payload) either side may send, in bytes.
pub(crate) const MAX_HELLO: usize = 1024;

const MAGIC: [u8; 8] = *b"HCOMAUTH";
const VERSION: u32 = 1;
const NONCE_LEN: usize = 32;
const MAC_LEN: usize = 32;
const CLIENT_LABEL: &[u8] = b"hcomm auth v1: client proof\0";
const SERVER_LABEL: &[u8] = b"hcomm auth v1: server proof\0";
const ACCEPTED: u8 = 0;
const REFUSED: u8 = 1;
/// Magic, version, nonce and hello length: the fixed part of messages 1 and 2.
const GREETING_LEN: usize = MAGIC.len() + 4 + NONCE_LEN + 4;

const SECRET_HINT: &str = "check that HCOMM_JOB_SECRET is the same for every rank of the job";

type HmacSha256 = Hmac<Sha256>;

/// Which end of the handshake we are, for messages.
#[derive(Clone, Copy)]
enum Side {
    Client,
    Server,
}

impl Side {
    fn name(self) -> &'static str {
        match self {
            Side::Client => "client",
            Side::Server => "server",
        }
    }
}

/// A failed handshake, with whether trying again on a new connection can help.
#[derive(Debug)]
pub(crate) struct HandshakeError {
    /// The peer closed or reset the connection before giving a verdict (for example a busy
    /// server shedding connections); a new attempt may succeed. A refusal or a bad proof is
    /// never retryable.
    pub(crate) retryable: bool,
    /// The error for the caller (boxed: the result of every handshake step carries it).
    pub(crate) error: Box<Error>,
}

impl HandshakeError {
    fn fatal(error: Error) -> HandshakeError {
        HandshakeError {
            retryable: false,
            error: Box::new(error),
        }
    }
}

/// Client side: authenticates the server behind `stream` and proves our own knowledge of
/// `secret`, all before `deadline`.
///
/// `hello` (at most `MAX_HELLO` bytes) is an application payload sent to the server,
/// authenticated by the MAC. Returns the server's hello once the server has proven it holds
/// the secret. The stream's read and write timeouts are restored afterwards.
///
/// Errors: [`Error::Init`] when either side fails to authenticate (or the peer does not speak
/// this protocol), [`Error::Timeout`] when `deadline` passes, [`Error::InvalidArgument`] for an
/// empty secret or an over-long hello.
pub fn client_handshake(
    stream: &mut TcpStream,
    secret: &[u8],
    hello: &[u8],
    deadline: Instant,
) -> Result<Vec<u8>> {
    client_handshake_detailed(stream, secret, hello, deadline).map_err(|e| *e.error)
}

/// Server side: authenticates the client behind `stream` and proves our own knowledge of
/// `secret`, all before `deadline`.
///
/// Returns the client's hello, authenticated. A client whose proof fails is told it was
/// refused and gets nothing that depends on the secret. Errors as for [`client_handshake`].
pub(crate) fn server_handshake(
    stream: &mut TcpStream,
    secret: &[u8],
    hello: &[u8],
    deadline: Instant,
) -> Result<Vec<u8>> {
    server_handshake_shared(stream, secret, hello, deadline)
}

/// [`client_handshake`] on a shared stream, saying whether a failure is worth a retry.
pub(crate) fn client_handshake_detailed(
    stream: &TcpStream,
    secret: &[u8],
    hello: &[u8],
    deadline: Instant,
) -> std::result::Result<Vec<u8>, HandshakeError> {
    check_args(secret, hello).map_err(HandshakeError::fatal)?;
    let peer = peer_name(stream);
    with_saved_timeouts(stream, || {
        client_exchange(stream, &peer, secret, hello, deadline)
    })
}

/// [`server_handshake`] on a shared stream (the store keeps a second handle to shut it down).
pub(crate) fn server_handshake_shared(
    stream: &TcpStream,
    secret: &[u8],
    hello: &[u8],
    deadline: Instant,
) -> Result<Vec<u8>> {
    check_args(secret, hello)?;
    let peer = peer_name(stream);
    with_saved_timeouts(stream, || {
        server_exchange(stream, &peer, secret, hello, deadline)
    })
    .map_err(|e| *e.error)
}

fn check_args(secret: &[u8], hello: &[u8]) -> Result<()> {
    if secret.is_empty() {
        return Err(Error::invalid_argument(
            "the job secret is empty: set HCOMM_JOB_SECRET to the same non-empty value for \
             every rank",
        ));
    }
    if hello.len() > MAX_HELLO {
        return Err(Error::invalid_argument(format!(
            "handshake hello of {} bytes exceeds the limit of {MAX_HELLO} bytes",
            hello.len()
        )));
    }
    Ok(())
}

/// Runs `f`, then puts back the stream's read and write timeouts as they were.
fn with_saved_timeouts<T>(stream: &TcpStream, f: impl FnOnce() -> T) -> T {
    let read = stream.read_timeout();
    let write = stream.write_timeout();
    let out = f();
    // Best effort: on a broken socket these fail too, and the caller learns of it from `out`.
    if let Ok(t) = read {
        let _ = stream.set_read_timeout(t);
    }
    if let Ok(t) = write {
        let _ = stream.set_write_timeout(t);
    }
    out
}

/// The client's part of the handshake with `peer` (its name, for messages) on `stream`.
fn client_exchange<S: TimedStream + ?Sized>(
    stream: &S,
    peer: &str,
    secret: &[u8],
    hello: &[u8],
    deadline: Instant,
) -> std::result::Result<Vec<u8>, HandshakeError> {
    let side = Side::Client;
    let io = |step: &str, e: io::Error| io_failure(side, peer, step, e, deadline);

    let client_nonce = nonce()?;
    write_all_until(stream, &greeting(&client_nonce, hello), deadline)
        .map_err(|e| io("sending the challenge", e))?;
    let (server_nonce, server_hello) = read_greeting(stream, side, peer, deadline)?;

    let transcript = Transcript {
        client_nonce: &client_nonce,
        server_nonce: &server_nonce,
        client_hello: hello,
        server_hello: &server_hello,
    };
    let proof = transcript
        .mac(secret, CLIENT_LABEL)?
        .finalize()
        .into_bytes();
    write_all_until(stream, &proof, deadline).map_err(|e| io("sending our proof", e))?;

    let mut verdict = [0u8; 1];
    read_exact_until(stream, &mut verdict, deadline).map_err(|e| io("reading the verdict", e))?;
    match verdict[0] {
        ACCEPTED => {}
        REFUSED => {
            return Err(HandshakeError::fatal(Error::init(format!(
                "authentication with {peer} failed on the client side: the server refused our \
                 proof of the job secret; {SECRET_HINT}"
            ))))
        }
        other => {
            return Err(HandshakeError::fatal(Error::init(format!(
                "authentication with {peer} failed on the client side: unknown verdict \
                 {other:#04x} (not an hcomm peer, or a different hcomm version)"
            ))))
        }
    }
    let mut server_proof = [0u8; MAC_LEN];
    read_exact_until(stream, &mut server_proof, deadline)
        .map_err(|e| io("reading the server's proof", e))?;
    transcript
        .mac(secret, SERVER_LABEL)?
        .verify_slice(&server_proof)
        .map_err(|_| {
            HandshakeError::fatal(Error::init(format!(
                "authentication with {peer} failed on the client side: the server could not \
                 prove it holds the job secret; {SECRET_HINT}"
            )))
        })?;
    Ok(server_hello)
}

/// The server's part of the handshake with `peer` (its name, for messages) on `stream`.
fn server_exchange<S: TimedStream + ?Sized>(
    stream: &S,
    peer: &str,
    secret: &[u8],
    hello: &[u8],
    deadline: Instant,
) -> std::result::Result<Vec<u8>, HandshakeError> {
    let side = Side::Server;
    let io = |step: &str, e: io::Error| io_failure(side, peer, step, e, deadline);

    let (client_nonce, client_hello) = read_greeting(stream, side, peer, deadline)?;
    let server_nonce = nonce()?;
    write_all_until(stream, &greeting(&server_nonce, hello), deadline)
        .map_err(|e| io("sending the challenge", e))?;

    let mut client_proof = [0u8; MAC_LEN];
    read_exact_until(stream, &mut client_proof, deadline)
        .map_err(|e| io("reading the client's proof", e))?;
    let transcript = Transcript {
        client_nonce: &client_nonce,
        server_nonce: &server_nonce,
        client_hello: &client_hello,
        server_hello: hello,
    };
    if transcript
        .mac(secret, CLIENT_LABEL)?
        .verify_slice(&client_proof)
        .is_err()
    {
        // Tell the client, so it reports a refusal rather than a lost connection; best effort.
        let _ = write_all_until(stream, &[REFUSED], deadline);
        return Err(HandshakeError::fatal(Error::init(format!(
            "authentication of {peer} failed on the server side: the client could not prove it \
             holds the job secret; {SECRET_HINT}"
        ))));
    }
    let mut reply = [0u8; 1 + MAC_LEN];
    reply[0] = ACCEPTED;
    reply[1..].copy_from_slice(
        &transcript
            .mac(secret, SERVER_LABEL)?
            .finalize()
            .into_bytes(),
    );
    write_all_until(stream, &reply, deadline).map_err(|e| io("sending our proof", e))?;
    Ok(client_hello)
}

/// Everything both MACs cover.
struct Transcript<'a> {
    client_nonce: &'a [u8; NONCE_LEN],
    server_nonce: &'a [u8; NONCE_LEN],
    client_hello: &'a [u8],
    server_hello: &'a [u8],
}

impl Transcript<'_> {
    fn mac(&self, secret: &[u8], label: &[u8]) -> std::result::Result<HmacSha256, HandshakeError> {
        let mut mac = <HmacSha256 as Mac>::new_from_slice(secret).map_err(|e| {
            HandshakeError::fatal(Error::internal(format!("HMAC rejected the key: {e}")))
        })?;
        mac.update(label);
        mac.update(self.client_nonce);
        mac.update(self.server_nonce);
        // Lengths make the concatenation unambiguous; both hellos are <= MAX_HELLO.
        mac.update(&(self.client_hello.len() as u32).to_le_bytes());
        mac.update(self.client_hello);
        mac.update(&(self.server_hello.len() as u32).to_le_bytes());
        mac.update(self.server_hello);
        Ok(mac)
    }
}

fn nonce() -> std::result::Result<[u8; NONCE_LEN], HandshakeError> {
    let mut n = [0u8; NONCE_LEN];
    getrandom::fill(&mut n).map_err(|e| {
        HandshakeError::fatal(Error::init(format!(
            "could not get random bytes from the operating system for authentication: {e}"
        )))
    })?;
    Ok(n)
}

/// Message 1 or 2: magic, version, nonce, hello.
fn greeting(nonce: &[u8; NONCE_LEN], hello: &[u8]) -> Vec<u8> {
    let mut msg = Vec::with_capacity(GREETING_LEN + hello.len());
    msg.extend_from_slice(&MAGIC);
    msg.extend_from_slice(&VERSION.to_le_bytes());
    msg.extend_from_slice(nonce);
    msg.extend_from_slice(&(hello.len() as u32).to_le_bytes());
    msg.extend_from_slice(hello);
    msg
}

/// Reads and checks the peer's message 1 or 2; the hello length is checked before any
/// allocation.
fn read_greeting<S: TimedStream + ?Sized>(
    stream: &S,
    side: Side,
    peer: &str,
    deadline: Instant,
) -> std::result::Result<([u8; NONCE_LEN], Vec<u8>), HandshakeError> {
    let io = |e: io::Error| io_failure(side, peer, "reading the peer's challenge", e, deadline);
    let protocol = |what: String| {
        HandshakeError::fatal(Error::init(format!(
            "authentication with {peer} failed on the {} side: {what}",
            side.name()
        )))
    };
    let mut head = [0u8; GREETING_LEN];
    read_exact_until(stream, &mut head, deadline).map_err(io)?;
    let (magic, rest) = head.split_at(MAGIC.len());
    let (version, rest) = rest.split_at(4);
    let (nonce, len) = rest.split_at(NONCE_LEN);
    if magic != MAGIC {
        return Err(protocol(
            "the peer does not speak the hcomm handshake (bad magic): check the address".into(),
        ));
    }
    let version = u32::from_le_bytes(version.try_into().unwrap_or_default());
    if version != VERSION {
        return Err(protocol(format!(
            "the peer speaks handshake version {version}, we speak {VERSION}: run the same hcomm \
             version on every rank"
        )));
    }
    let len = u32::from_le_bytes(len.try_into().unwrap_or_default()) as usize;
    if len > MAX_HELLO {
        return Err(protocol(format!(
            "the peer's hello claims {len} bytes, more than the limit of {MAX_HELLO}"
        )));
    }
    let hello = read_vec_until(stream, len, deadline).map_err(io)?;
    let mut n = [0u8; NONCE_LEN];
    n.copy_from_slice(nonce);
    Ok((n, hello))
}

/// Maps an I/O failure during the handshake: deadline -> Timeout; the peer hanging up ->
/// retryable Init; anything else -> Init.
///
/// None of these blames the secret: a peer with another secret does not hang up, it says so
/// (the server sends its refusal, the client finds the server's proof wrong). A peer that
/// hangs up mid-handshake is a busy listener shedding connections, a process that is not an
/// hcomm rank, or one that died.
fn io_failure(
    side: Side,
    peer: &str,
    step: &str,
    e: io::Error,
    deadline: Instant,
) -> HandshakeError {
    let side = side.name();
    if e.kind() == io::ErrorKind::TimedOut || Instant::now() >= deadline {
        return HandshakeError::fatal(
            Error::timeout(format!(
                "authentication with {peer} did not complete in time on the {side} side (while \
             {step}): the peer is slow, stuck or not an hcomm process"
            ))
            .with_source(e),
        );
    }
    let closed = matches!(
        e.kind(),
        io::ErrorKind::UnexpectedEof
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::WriteZero
    );
    let what = if closed {
        "the peer closed the connection before authenticating (a busy listener shedding \
         connections, a process that is not an hcomm rank, or one that ended)"
    } else {
        "I/O error"
    };
    HandshakeError {
        retryable: closed,
        error: Box::new(
            Error::init(format!(
                "authentication with {peer} failed on the {side} side while {step}: {what} ({e})"
            ))
            .with_source(e),
        ),
    }
}

fn peer_name(stream: &TcpStream) -> String {
    match stream.peer_addr() {
        Ok(a) => a.to_string(),
        Err(_) => "an unknown peer".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpListener;
    use std::thread;
    use std::time::Duration;

    fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (b, _) = listener.accept().unwrap();
        (a, b)
    }

    fn soon() -> Instant {
        Instant::now() + Duration::from_secs(5)
    }

    fn run(
        client_secret: &'static [u8],
        server_secret: &'static [u8],
    ) -> (Result<Vec<u8>>, Result<Vec<u8>>) {
        let (mut c, mut s) = pair();
        let server =
            thread::spawn(move || server_handshake(&mut s, server_secret, b"server hi", soon()));
        let client = client_handshake(&mut c, client_secret, b"client hi", soon());
        (client, server.join().unwrap())
    }

    #[test]
    fn same_secret_authenticates_both_ways_and_swaps_hellos() {
        let (client, server) = run(b"s3cret", b"s3cret");
        assert_eq!(client.unwrap(), b"server hi");
        assert_eq!(server.unwrap(), b"client hi");
    }

    #[test]
    fn wrong_secret_is_refused_on_both_sides() {
        let (client, server) = run(b"wrong", b"s3cret");
        let client = client.unwrap_err();
        let server = server.unwrap_err();
        assert!(
            matches!(client, Error::Init(ref m) if m.message.contains("client side")),
            "{client}"
        );
        assert!(
            matches!(server, Error::Init(ref m) if m.message.contains("server side")),
            "{server}"
        );
        assert!(client.to_string().contains("HCOMM_JOB_SECRET"));
    }

    #[test]
    fn timeouts_are_restored() {
        let (mut c, mut s) = pair();
        c.set_read_timeout(Some(Duration::from_secs(7))).unwrap();
        let server = thread::spawn(move || server_handshake(&mut s, b"k", b"", soon()));
        client_handshake(&mut c, b"k", b"", soon()).unwrap();
        server.join().unwrap().unwrap();
        assert_eq!(c.read_timeout().unwrap(), Some(Duration::from_secs(7)));
        assert_eq!(c.write_timeout().unwrap(), None);
    }

    #[test]
    fn silent_client_times_out() {
        let (_c, mut s) = pair();
        let start = Instant::now();
        let err = server_handshake(&mut s, b"k", b"", start + Duration::from_millis(200));
        assert!(matches!(err, Err(Error::Timeout(_))), "{err:?}");
        assert!(start.elapsed() < Duration::from_secs(2));
    }

    #[test]
    fn oversized_hello_is_rejected_before_reading_it() {
        let (mut c, mut s) = pair();
        let mut msg = greeting(&[0u8; NONCE_LEN], b"");
        let len_at = GREETING_LEN - 4;
        msg[len_at..].copy_from_slice(&u32::MAX.to_le_bytes());
        c.write_all(&msg).unwrap();
        let err = server_handshake(&mut s, b"k", b"", soon()).unwrap_err();
        assert!(
            matches!(err, Error::Init(ref m) if m.message.contains("hello claims")),
            "{err}"
        );
    }

    #[test]
    fn bad_magic_is_rejected() {
        let (mut c, mut s) = pair();
        c.write_all(&[0xAB; GREETING_LEN]).unwrap();
        let err = server_handshake(&mut s, b"k", b"", soon()).unwrap_err();
        assert!(
            matches!(err, Error::Init(ref m) if m.message.contains("bad magic")),
            "{err}"
        );
    }

    #[test]
    fn replayed_proof_from_another_session_is_refused() {
        // Record a genuine client's proof, then replay it on a new connection: the server's
        // fresh nonce makes it worthless.
        let (mut c, mut s) = pair();
        let server = thread::spawn(move || server_handshake(&mut s, b"k", b"", soon()));
        let (mut c2, mut s2) = pair();
        let server2 = thread::spawn(move || server_handshake(&mut s2, b"k", b"", soon()));
        // Session 1 as an eavesdropper sees it: greeting and proof from a real client.
        let cn = [7u8; NONCE_LEN];
        c.write_all(&greeting(&cn, b"")).unwrap();
        let mut head = [0u8; GREETING_LEN];
        c.read_exact(&mut head).unwrap();
        let sn: [u8; NONCE_LEN] = head[12..12 + NONCE_LEN].try_into().unwrap();
        let t = Transcript {
            client_nonce: &cn,
            server_nonce: &sn,
            client_hello: b"",
            server_hello: b"",
        };
        let proof = t.mac(b"k", CLIENT_LABEL).unwrap().finalize().into_bytes();
        c.write_all(&proof).unwrap();
        assert_eq!(server.join().unwrap().unwrap(), b"");
        // Session 2: same client nonce, replayed proof.
        c2.write_all(&greeting(&cn, b"")).unwrap();
        c2.read_exact(&mut head).unwrap();
        c2.write_all(&proof).unwrap();
        let err = server2.join().unwrap().unwrap_err();
        assert!(matches!(err, Error::Init(_)), "{err}");
        let mut verdict = [0u8; 1];
        c2.read_exact(&mut verdict).unwrap();
        assert_eq!(verdict[0], REFUSED);
    }

    #[test]
    fn server_proof_cannot_be_reflected_as_client_proof() {
        let t = Transcript {
            client_nonce: &[1; NONCE_LEN],
            server_nonce: &[2; NONCE_LEN],
            client_hello: b"a",
            server_hello: b"b",
        };
        let c = t.mac(b"k", CLIENT_LABEL).unwrap().finalize().into_bytes();
        let s = t.mac(b"k", SERVER_LABEL).unwrap().finalize().into_bytes();
        assert_ne!(c, s);
    }

    #[test]
    fn bad_arguments_are_rejected_locally() {
        let (mut c, _s) = pair();
        let err = client_handshake(&mut c, b"", b"", soon()).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)));
        let err = client_handshake(&mut c, b"k", &[0; MAX_HELLO + 1], soon()).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)));
    }

    #[test]
    fn server_hanging_up_is_retryable() {
        let (c, s) = pair();
        drop(s);
        let err = client_handshake_detailed(&c, b"k", b"", soon()).unwrap_err();
        assert!(err.retryable, "{}", err.error);
        assert!(matches!(*err.error, Error::Init(_)));
        // A hang-up says nothing about the secret: the message must not send the user there.
        assert!(
            !err.error.to_string().contains("HCOMM_JOB_SECRET"),
            "{}",
            err.error
        );
    }

    /// What a well-behaved peer sends: a greeting with hellos of several lengths, followed by
    /// `tail` (a proof, or a verdict and a proof).
    fn peer_messages(tail: &dyn Fn(&mut crate::fuzz::Rng) -> Vec<u8>) -> Vec<Vec<u8>> {
        let mut rng = crate::fuzz::Rng::new(7);
        [0, 1, 9, 16, 200, MAX_HELLO]
            .into_iter()
            .map(|len| {
                let mut nonce = [0u8; NONCE_LEN];
                rng.fill(&mut nonce);
                let mut hello = vec![0u8; len];
                rng.fill(&mut hello);
                let mut msg = greeting(&nonce, &hello);
                msg.extend(tail(&mut rng));
                msg
            })
            .collect()
    }

    fn random_bytes(rng: &mut crate::fuzz::Rng, n: usize) -> Vec<u8> {
        let mut v = vec![0u8; n];
        rng.fill(&mut v);
        v
    }

    fn fuzz_target(name: &'static str, seeds: Vec<Vec<u8>>) -> crate::fuzz::Target {
        crate::fuzz::Target {
            name,
            default_cases: 20_000,
            seeds,
            max_len: GREETING_LEN + MAX_HELLO + 1 + MAC_LEN + 64,
            dict: vec![
                u64::from_le_bytes(MAGIC),
                VERSION as u64,
                MAX_HELLO as u64,
                ACCEPTED as u64,
                REFUSED as u64,
            ],
        }
    }

    /// Most bytes a handshake may hold allocated, whatever the peer claims: two hellos and
    /// the messages of its errors.
    const HANDSHAKE_MEMORY: usize = 4 * MAX_HELLO + 8192;

    /// Whatever a client without the secret sends, in whatever pieces, the server refuses it
    /// (the proof cannot match its fresh nonce) without panicking, reads no more than the
    /// protocol's messages, allocates no more than [`HANDSHAKE_MEMORY`], and answers at
    /// most its greeting and a refusal.
    #[test]
    fn fuzz_auth_server() {
        let seeds = peer_messages(&|rng| random_bytes(rng, MAC_LEN));
        crate::fuzz::run(&fuzz_target("auth server", seeds), |input, rng| {
            let stream = super::super::MemStream::new(input, 1 + rng.len(input.len()));
            let deadline = Instant::now() + Duration::from_secs(60);
            let (result, usage) = crate::fuzz::measure(|| {
                server_exchange(&stream, "fuzzer", b"k", b"server hi", deadline)
            });
            let err = result.expect_err("a client without the secret was accepted");
            assert!(matches!(*err.error, Error::Init(_)), "{}", err.error);
            assert!(usage.peak <= HANDSHAKE_MEMORY, "{usage:?}");
            assert!(stream.consumed() <= GREETING_LEN + MAX_HELLO + MAC_LEN);
            let out = stream.take_output();
            let ours = GREETING_LEN + b"server hi".len();
            assert!(out.is_empty() || out[..MAGIC.len()] == MAGIC, "{out:?}");
            assert!(out.is_empty() || out.len() == ours || out.len() == ours + 1);
            if out.len() == ours + 1 {
                assert_eq!(out[ours], REFUSED);
            }
        });
    }

    /// Whatever a server without the secret answers, the client refuses it (the server's
    /// proof cannot match the client's fresh nonce) without panicking, with memory bounded
    /// by [`HANDSHAKE_MEMORY`], and sends nothing but its greeting and its proof.
    #[test]
    fn fuzz_auth_client() {
        let seeds = peer_messages(&|rng| {
            let mut tail = random_bytes(rng, 1 + MAC_LEN);
            tail[0] = ACCEPTED;
            tail
        });
        crate::fuzz::run(&fuzz_target("auth client", seeds), |input, rng| {
            let stream = super::super::MemStream::new(input, 1 + rng.len(input.len()));
            let deadline = Instant::now() + Duration::from_secs(60);
            let (result, usage) = crate::fuzz::measure(|| {
                client_exchange(&stream, "fuzzer", b"k", b"client hi", deadline)
            });
            let err = result.expect_err("a server without the secret was accepted");
            assert!(matches!(*err.error, Error::Init(_)), "{}", err.error);
            assert!(usage.peak <= HANDSHAKE_MEMORY, "{usage:?}");
            assert!(stream.consumed() <= GREETING_LEN + MAX_HELLO + 1 + MAC_LEN);
            let out = stream.take_output();
            let ours = GREETING_LEN + b"client hi".len();
            assert!(
                out.len() == ours || out.len() == ours + MAC_LEN,
                "{}",
                out.len()
            );
        });
    }

    /// A greeting read back in any pieces is the nonce and hello that were sent, and nothing
    /// more is read.
    #[test]
    fn fuzz_greeting_round_trip() {
        let target = crate::fuzz::Target {
            default_cases: 50_000,
            ..fuzz_target("auth greeting round trip", vec![Vec::new()])
        };
        crate::fuzz::run(&target, |input, rng| {
            let mut nonce = [0u8; NONCE_LEN];
            rng.fill(&mut nonce);
            let hello = &input[..input.len().min(MAX_HELLO)];
            let mut msg = greeting(&nonce, hello);
            msg.extend_from_slice(b"next");
            let stream = super::super::MemStream::new(&msg, 1 + rng.len(msg.len()));
            let deadline = Instant::now() + Duration::from_secs(60);
            let (n, h) = read_greeting(&stream, Side::Server, "fuzzer", deadline)
                .map_err(|e| *e.error)
                .unwrap();
            assert_eq!((n, &h[..]), (nonce, hello));
            assert_eq!(stream.consumed(), msg.len() - 4);
        });
    }
}
