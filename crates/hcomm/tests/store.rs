//! The rendezvous store over real sockets on 127.0.0.1: operations, concurrency, timeouts,
//! authentication, and legitimate clients staying served while hostile connections attack.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use hcomm::internal::bootstrap::auth;
use hcomm::internal::bootstrap::store::{
    HANDSHAKE_TIMEOUT, MAX_PENDING_HANDSHAKES, MAX_VALUE, STALE_HANDSHAKE,
};
use hcomm::internal::bootstrap::{RendezvousStore, StoreClient};
use hcomm::Error;
use hcomm_testkit::{free_addr, Rng};

const SECRET: &[u8] = b"integration-test-secret";
const T: Duration = Duration::from_secs(5);

fn start() -> (RendezvousStore, String) {
    let store = RendezvousStore::bind("127.0.0.1:0".parse().unwrap(), SECRET).unwrap();
    let addr = store.local_addr().to_string();
    (store, addr)
}

fn client(addr: &str) -> StoreClient {
    StoreClient::connect(addr, SECRET, T).unwrap()
}

/// Runs `f` and checks it took less than `limit`.
fn within<R>(limit: Duration, what: &str, f: impl FnOnce() -> R) -> R {
    let start = Instant::now();
    let out = f();
    let took = start.elapsed();
    assert!(took < limit, "{what} took {took:?}, limit {limit:?}");
    out
}

#[test]
fn set_get_wait_add_delete() {
    let (store, addr) = start();
    let mut c = client(&addr);
    assert_eq!(c.local_addr().ip(), store.local_addr().ip());
    assert_eq!(c.get("missing").unwrap(), None);
    c.set("k", b"v1").unwrap();
    assert_eq!(c.get("k").unwrap().unwrap(), b"v1");
    c.set("k", b"v2").unwrap();
    assert_eq!(c.wait("k", T).unwrap(), b"v2");
    c.set("empty", b"").unwrap();
    assert_eq!(c.get("empty").unwrap().unwrap(), b"");
    assert_eq!(c.add("n", 5).unwrap(), 5);
    assert_eq!(c.add("n", -7).unwrap(), -2);
    assert_eq!(c.get("n").unwrap().unwrap(), (-2i64).to_le_bytes());
    assert!(c.delete("k").unwrap());
    assert!(!c.delete("k").unwrap());
    assert_eq!(c.get("k").unwrap(), None);
    // Another client sees the same data.
    let mut d = client(&addr);
    assert_eq!(d.add("n", 2).unwrap(), 0);
}

#[test]
fn largest_value_round_trips() {
    let (_store, addr) = start();
    let mut c = client(&addr);
    let value: Vec<u8> = (0..MAX_VALUE).map(|i| (i * 7) as u8).collect();
    c.set("big", &value).unwrap();
    assert_eq!(client(&addr).get("big").unwrap().unwrap(), value);
}

#[test]
fn concurrent_adders_reach_the_exact_total() {
    const THREADS: usize = 16;
    const ADDS: usize = 250;
    let (_store, addr) = start();
    let workers: Vec<_> = (0..THREADS)
        .map(|_| {
            let addr = addr.clone();
            thread::spawn(move || {
                let mut c = client(&addr);
                (0..ADDS)
                    .map(|_| c.add("counter", 1).unwrap())
                    .collect::<Vec<i64>>()
            })
        })
        .collect();
    let mut seen: Vec<i64> = workers
        .into_iter()
        .flat_map(|w| w.join().unwrap())
        .collect();
    seen.sort_unstable();
    // Atomic: every intermediate value was handed out exactly once.
    let expected: Vec<i64> = (1..=(THREADS * ADDS) as i64).collect();
    assert_eq!(seen, expected);
    let total = client(&addr).add("counter", 0).unwrap();
    assert_eq!(total, (THREADS * ADDS) as i64);
}

#[test]
fn wait_is_satisfied_by_a_later_set_from_another_client() {
    let (_store, addr) = start();
    let mut waiter = client(&addr);
    let mut setter = client(&addr);
    let handle = thread::spawn(move || {
        let start = Instant::now();
        (waiter.wait("ready", T), start.elapsed())
    });
    thread::sleep(Duration::from_millis(200));
    setter.set("ready", b"go").unwrap();
    let (got, took) = handle.join().unwrap();
    assert_eq!(got.unwrap(), b"go");
    assert!(
        took >= Duration::from_millis(150),
        "returned before the set: {took:?}"
    );
    assert!(took < Duration::from_secs(2), "{took:?}");
}

#[test]
fn many_waiters_on_different_keys_wake_correctly() {
    let (_store, addr) = start();
    let waiters: Vec<_> = (0..8)
        .map(|i| {
            let mut c = client(&addr);
            thread::spawn(move || c.wait(&format!("key{i}"), T).unwrap())
        })
        .collect();
    thread::sleep(Duration::from_millis(100));
    let mut setter = client(&addr);
    for i in (0..8).rev() {
        setter
            .set(&format!("key{i}"), format!("value{i}").as_bytes())
            .unwrap();
    }
    for (i, w) in waiters.into_iter().enumerate() {
        assert_eq!(w.join().unwrap(), format!("value{i}").as_bytes());
    }
}

#[test]
fn wait_timeout_is_quick_and_names_the_key() {
    let (_store, addr) = start();
    let mut c = client(&addr);
    let start = Instant::now();
    let err = c.wait("never-set", Duration::from_millis(300)).unwrap_err();
    let took = start.elapsed();
    assert!(
        matches!(err, Error::Timeout(ref m) if m.message.contains("never-set")),
        "{err}"
    );
    assert!(
        took >= Duration::from_millis(250) && took < Duration::from_millis(1500),
        "{took:?}"
    );
    // The connection is still usable after a timed-out wait.
    c.set("after", b"1").unwrap();
    assert_eq!(c.wait("after", Duration::ZERO).unwrap(), b"1");
}

#[test]
fn wrong_secret_is_refused_with_init() {
    let (_store, addr) = start();
    let err = within(Duration::from_secs(2), "refusal", || {
        StoreClient::connect(&addr, b"not-the-secret", T).unwrap_err()
    });
    assert!(
        matches!(err, Error::Init(ref m) if m.message.contains("HCOMM_JOB_SECRET")),
        "{err}"
    );
    // The store is unaffected.
    client(&addr).set("k", b"v").unwrap();
}

#[test]
fn client_may_start_before_the_store() {
    let addr = free_addr();
    let connecting = thread::spawn(move || StoreClient::connect(&addr.to_string(), SECRET, T));
    thread::sleep(Duration::from_millis(300));
    let _store = RendezvousStore::bind(addr, SECRET).unwrap();
    let mut c = connecting.join().unwrap().unwrap();
    c.set("late", b"ok").unwrap();
}

#[test]
fn connecting_to_nothing_times_out() {
    let addr = free_addr().to_string();
    let err = within(Duration::from_secs(2), "connect", || {
        StoreClient::connect(&addr, SECRET, Duration::from_millis(300)).unwrap_err()
    });
    assert!(
        matches!(err, Error::Timeout(ref m) if m.message.contains(&addr)),
        "{err}"
    );
}

#[test]
fn dropping_the_store_fails_clients_promptly() {
    let (store, addr) = start();
    let mut c = client(&addr);
    c.set("k", b"v").unwrap();
    within(Duration::from_secs(2), "drop", || drop(store));
    let err = within(Duration::from_secs(2), "request after drop", || {
        c.get("k").unwrap_err()
    });
    assert!(matches!(err, Error::Transport(_)), "{err}");
}

/// The ranks of a large job arrive at once, more of them than there are handshake slots: each
/// gets in at its first attempt (no retry), since the store leaves the ones it cannot handshake
/// yet waiting in its listen backlog instead of turning them away. Every client connects before
/// any starts its handshake, so that the slots are all taken when the last ones arrive.
#[test]
fn a_crowd_larger_than_the_handshake_slots_gets_in_at_the_first_attempt() {
    let (store, _) = start();
    let sock = store.local_addr();
    let n = MAX_PENDING_HANDSHAKES + 64;
    let (start, connected) = (Arc::new(Barrier::new(n)), Arc::new(Barrier::new(n)));
    let crowd: Vec<_> = (0..n)
        .map(|_| {
            let (start, connected) = (Arc::clone(&start), Arc::clone(&connected));
            thread::Builder::new()
                .stack_size(128 << 10)
                .spawn(move || {
                    start.wait();
                    let s = TcpStream::connect_timeout(&sock, T);
                    connected.wait();
                    let mut s = s.map_err(|e| e.to_string())?;
                    let deadline = Instant::now() + T;
                    auth::client_handshake(&mut s, SECRET, b"hcomm-store/2", deadline)
                        .map_err(|e| e.to_string())
                })
                .unwrap()
        })
        .collect();
    let refused: Vec<String> = crowd
        .into_iter()
        .filter_map(|t| t.join().unwrap().err())
        .collect();
    assert!(
        refused.is_empty(),
        "{} of {n} refused: {refused:?}",
        refused.len()
    );
}

/// Repeats `attack` every few milliseconds on a thread until `stop`.
fn attacker(
    stop: &Arc<AtomicBool>,
    mut attack: impl FnMut() + Send + 'static,
) -> thread::JoinHandle<usize> {
    let stop = Arc::clone(stop);
    thread::spawn(move || {
        let mut rounds = 0;
        while !stop.load(Ordering::Relaxed) {
            attack();
            rounds += 1;
            thread::sleep(Duration::from_millis(10));
        }
        rounds
    })
}

/// Sends the handshake magic one byte every 100 ms until the store hangs up; returns how long
/// the connection lasted, or `None` if it outlived the handshake timeout by far.
fn slowloris(sock: SocketAddr) -> Option<Duration> {
    let mut s = TcpStream::connect_timeout(&sock, T).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    s.set_write_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let start = Instant::now();
    for byte in b"HCOMAUTH".iter().cycle() {
        if start.elapsed() > HANDSHAKE_TIMEOUT + Duration::from_secs(5) {
            return None;
        }
        if s.write_all(&[*byte]).is_err() {
            return Some(start.elapsed());
        }
        match s.read(&mut [0u8; 1]) {
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            _ => return Some(start.elapsed()),
        }
    }
    None
}

#[test]
fn slowloris_is_cut_off_at_the_handshake_timeout_without_stalling_others() {
    let (store, addr) = start();
    let sock = store.local_addr();
    let slow = thread::spawn(move || slowloris(sock));
    let mut c = client(&addr);
    let mut n = 0;
    while !slow.is_finished() {
        n += 1;
        within(Duration::from_secs(2), "add", || {
            assert_eq!(c.add("n", 1).unwrap(), n)
        });
        thread::sleep(Duration::from_millis(50));
    }
    let lasted = slow.join().unwrap().expect("slowloris was never cut off");
    assert!(
        lasted > HANDSHAKE_TIMEOUT - Duration::from_millis(500)
            && lasted < HANDSHAKE_TIMEOUT + Duration::from_secs(2),
        "slowloris lasted {lasted:?}"
    );
    // A fresh client connects at once afterwards.
    within(Duration::from_secs(2), "connect", || client(&addr));
}

#[test]
fn hostile_connections_do_not_disturb_legitimate_clients() {
    let (store, addr) = start();
    let sock: SocketAddr = store.local_addr();
    let mut a = client(&addr);
    let mut b = client(&addr);
    a.set("before", b"attack").unwrap();
    // Started first, so it holds the oldest handshake slot.
    let slow = thread::spawn(move || slowloris(sock));

    // More silent connections than there are handshake slots, held open for the whole attack.
    let silent: Vec<TcpStream> = (0..MAX_PENDING_HANDSHAKES + 44)
        .map(|_| TcpStream::connect_timeout(&sock, T).unwrap())
        .collect();

    let stop = Arc::new(AtomicBool::new(false));
    let mut rng = Rng::new(0x9E37_79B9_7F4A_7C15);
    let attackers = vec![
        // Random bytes.
        attacker(&stop, move || {
            if let Ok(mut s) = TcpStream::connect_timeout(&sock, T) {
                let mut junk = [0u8; 4096];
                rng.fill(&mut junk);
                let _ = s.write_all(&junk);
            }
        }),
        // A well-formed greeting whose hello claims 4 GiB.
        attacker(&stop, move || {
            if let Ok(mut s) = TcpStream::connect_timeout(&sock, T) {
                let mut msg = b"HCOMAUTH".to_vec();
                msg.extend_from_slice(&1u32.to_le_bytes());
                msg.extend_from_slice(&[0u8; 32]);
                msg.extend_from_slice(&u32::MAX.to_le_bytes());
                let _ = s.write_all(&msg);
                let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
                let _ = s.read(&mut [0u8; 1]);
            }
        }),
        // Clients that authenticate with the wrong secret.
        attacker(&stop, {
            let addr = addr.clone();
            move || {
                let wrong = StoreClient::connect(&addr, b"guess", Duration::from_millis(500));
                assert!(wrong.is_err(), "a wrong secret was accepted");
            }
        }),
    ];
    // Legitimate work during the attack: every operation stays fast.
    let limit = Duration::from_secs(2);
    let attack_start = Instant::now();
    let mut round = 0i64;
    while attack_start.elapsed() < Duration::from_millis(1500) {
        round += 1;
        let key = format!("k{round}");
        within(limit, "set", || a.set(&key, b"value").unwrap());
        within(limit, "get", || {
            assert_eq!(b.get(&key).unwrap().unwrap(), b"value")
        });
        within(limit, "wait", || {
            assert_eq!(b.wait(&key, T).unwrap(), b"value")
        });
        within(limit, "add", || {
            assert_eq!(a.add("rounds", 1).unwrap(), round)
        });
        within(limit, "delete", || assert!(b.delete(&key).unwrap()));
    }
    // A rank that joins in the middle of the attack still gets in: at the latest when the
    // oldest intruder has held its slot for STALE_HANDSHAKE.
    let mut late = within(STALE_HANDSHAKE + limit, "connect during the attack", || {
        client(&addr)
    });
    within(limit, "wait during the attack", || {
        let waiter = thread::spawn(move || late.wait("signal", T).unwrap());
        thread::sleep(Duration::from_millis(50));
        a.set("signal", b"now").unwrap();
        assert_eq!(waiter.join().unwrap(), b"now");
    });

    let cut_after = slow.join().unwrap().expect("slowloris was never cut off");
    assert!(
        cut_after < HANDSHAKE_TIMEOUT + Duration::from_secs(2),
        "slowloris held its connection for {cut_after:?}"
    );
    stop.store(true, Ordering::Relaxed);
    for attack in attackers {
        assert!(attack.join().unwrap() > 0);
    }
    drop(silent);

    // The store is alive and has kept its data.
    let mut after = within(limit, "connect after the attack", || client(&addr));
    assert_eq!(after.get("before").unwrap().unwrap(), b"attack");
    assert_eq!(after.add("rounds", 0).unwrap(), round);
}
