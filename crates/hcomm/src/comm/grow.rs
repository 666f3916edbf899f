//! Growing a communicator: a member makes a single-use join token, the members grow the
//! communicator with it, and each new process joins with it (docs/fault-tolerance.md#grow).
//!
//! The grown communicator is the whole of a fresh world: its own store, engine, links and
//! shared memory, made the way `init` makes a job's world, with the members as its first ranks
//! (in their old order) and the new processes as the next ones. The old communicator and its
//! world go on untouched until released. A fresh world rather than new ranks in the old one:
//! the engine's peer table, the routes, the topology, the shared-memory inboxes (one ring per
//! ordered pair of local ranks, sized at creation) and every communicator's member list are
//! made for a fixed world size, and growing all of them under live traffic would touch every
//! layer; a world made anew is correct by the same code that starts every job, costs one
//! start-up (store round trips, connections on first use), and frees the old world's
//! resources once the old communicator is released.
//!
//! The token carries what a new process needs: the address of a rendezvous store that the
//! member who made the token hosts, the communicator's id, a random nonce and a key, the
//! HMAC-SHA256 of the id and the nonce under the job secret. The store, and then the new
//! world's connections, are authenticated with that key, so a process that holds the token
//! can join without the job secret, and one without the token (or the secret) cannot. The
//! members check the key against their own secret (a token not made in this job is refused)
//! and the id against the communicator's (a token of another communicator is refused); each
//! member refuses a token its communicator already grew with, and the store hands out only
//! the ranks the grow adds (a token used once more by a new process is refused).

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::OnceLock;
use std::time::Instant;

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use super::{rail_addrs, Boot, Communicator, World, COLL, INTERNAL, WORLD_ID};
use crate::bootstrap::{RendezvousStore, StoreClient};
use crate::config::{Config, Secret};
use crate::error::{Error, PeerRank, Result};
use crate::rng::mix;
use crate::sync::lock;
use crate::transport::plugin;
use crate::transport::shm::link;

/// What every token starts with: the format and its version.
const PREFIX: &str = "hcomm-join/1";
/// Label of the key's HMAC, so that no other MAC under the job secret can pass for a key.
const LABEL: &[u8] = b"hcomm join token v1\0";
/// Keeps the ids of grown communicators apart from those of `split`, `dup` and `shrink`.
const GROW_DOMAIN: u64 = 0x4772_6f77_0000_0001;
/// The grow store's key of the plan (published by the members' rank 0).
const PLAN: &str = "grow/plan";
/// The grow store's counter of the new ranks taken.
const CLAIMED: &str = "grow/claimed";
/// The prefix of the grown world's keys in the grow store.
const NS: &str = "grow/world";
/// Bytes of the nonce.
const NONCE_LEN: usize = 16;
/// Bytes of the key.
const KEY_LEN: usize = 32;
/// Bytes of an encoded plan.
const PLAN_LEN: usize = 8 + 8 + 8 + 4;

/// The longest token, in bytes (the C API's `HCOMM_JOIN_TOKEN_MAX` counts its NUL too).
pub const JOIN_TOKEN_MAX: usize = 255;

/// A grow's record, in the members' exchange, from the member whose token expired.
const EXPIRED: [u8; 16] = [0xff; 16];

/// What one communicator's handles share about growing it.
#[derive(Default)]
pub(super) struct GrowState {
    /// The stores of the tokens this rank made that no grow has used yet, by nonce. Each
    /// stops by itself `HCOMM_TIMEOUT` after its token was made unless a grow takes it first.
    stores: HashMap<[u8; NONCE_LEN], RendezvousStore>,
    /// The nonces of the tokens a grow of this communicator used (each may be used once).
    used: HashSet<[u8; NONCE_LEN]>,
    /// The nonces of this rank's tokens whose stores expired unused (and are dropped).
    expired: HashSet<[u8; NONCE_LEN]>,
}

impl GrowState {
    /// Drops the stores that expired (stopped already: their sockets and threads are gone),
    /// remembering their nonces.
    fn prune(&mut self) {
        let gone: Vec<_> = self
            .stores
            .iter()
            .filter(|(_, s)| s.expired())
            .map(|(n, _)| *n)
            .collect();
        for n in gone {
            self.stores.remove(&n);
            self.expired.insert(n);
        }
    }

    /// Takes the store of the token with `nonce` for a grow: `Ok(Some)` when this rank made
    /// it and it still serves (it now serves until the grown world drops it), `Ok(None)` when
    /// another member made it, `Err(())` when this rank made it and it expired.
    fn take(
        &mut self,
        nonce: &[u8; NONCE_LEN],
    ) -> std::result::Result<Option<RendezvousStore>, ()> {
        match self.stores.remove(nonce) {
            Some(store) if store.keep() => Ok(Some(store)),
            Some(_) => Err(()),
            None if self.expired.contains(nonce) => Err(()),
            None => Ok(None),
        }
    }
}

/// A join token, decoded.
struct Token {
    /// The id of the communicator it grows.
    comm: u64,
    nonce: [u8; NONCE_LEN],
    /// HMAC(job secret, LABEL | comm | nonce): authenticates the grow store and the new world.
    key: [u8; KEY_LEN],
    /// `host:port` of the grow store.
    addr: String,
}

impl Token {
    fn encode(&self) -> String {
        format!(
            "{PREFIX}/{:016x}/{}/{}/{}",
            self.comm,
            hex::encode(self.nonce),
            hex::encode(self.key),
            self.addr
        )
    }

    /// Decodes `s`; an `InvalidArgument` naming what is wrong, but not `s` (whose key
    /// admits its holder to the grown communicator, and errors end up in logs).
    fn parse(s: &str) -> Result<Token> {
        let bad = |why: &str| {
            Error::invalid_argument(format!(
                "the string of {} bytes passed is no join token ({why}): pass what \
                 Communicator::join_token (hcommCommJoinToken) returned",
                s.len()
            ))
        };
        if s.len() > JOIN_TOKEN_MAX {
            return Err(bad(&format!("it is longer than {JOIN_TOKEN_MAX} bytes")));
        }
        let rest = s
            .strip_prefix(PREFIX)
            .and_then(|r| r.strip_prefix('/'))
            .ok_or_else(|| bad(&format!("it does not start with {PREFIX}/")))?;
        let mut parts = rest.splitn(4, '/');
        let (Some(comm), Some(nonce), Some(key), Some(addr)) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(bad("it has too few fields"));
        };
        let comm = u64::from_str_radix(comm, 16).map_err(|_| bad("malformed communicator id"))?;
        let mut t = Token {
            comm,
            nonce: [0; NONCE_LEN],
            key: [0; KEY_LEN],
            addr: addr.to_owned(),
        };
        hex::decode_to_slice(nonce, &mut t.nonce).map_err(|_| bad("malformed nonce"))?;
        hex::decode_to_slice(key, &mut t.key).map_err(|_| bad("malformed key"))?;
        if addr.is_empty() {
            return Err(bad("no store address"));
        }
        Ok(t)
    }

    /// The secret of the grow store and of the grown world: the key, in hex.
    fn secret(&self) -> Secret {
        Secret::new(hex::encode(self.key))
    }
}

/// The MAC of a token of communicator `comm` with `nonce` under `secret`, ready to finalize
/// or verify.
fn key_mac(secret: &[u8], comm: u64, nonce: &[u8; NONCE_LEN]) -> Result<Hmac<Sha256>> {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(secret)
        .map_err(|e| Error::internal(format!("HMAC rejected the job secret: {e}")))?;
    mac.update(LABEL);
    mac.update(&comm.to_le_bytes());
    mac.update(nonce);
    Ok(mac)
}

/// What the members tell the new processes: how many members there are, how many ranks the
/// grow adds, the grown communicator's id and epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Plan {
    members: usize,
    added: usize,
    id: u64,
    epoch: u32,
}

impl Plan {
    fn encode(&self) -> [u8; PLAN_LEN] {
        let mut b = [0; PLAN_LEN];
        b[..8].copy_from_slice(&(self.members as u64).to_le_bytes());
        b[8..16].copy_from_slice(&(self.added as u64).to_le_bytes());
        b[16..24].copy_from_slice(&self.id.to_le_bytes());
        b[24..].copy_from_slice(&self.epoch.to_le_bytes());
        b
    }

    fn decode(b: &[u8]) -> Result<Plan> {
        let b: &[u8; PLAN_LEN] = b.try_into().map_err(|_| {
            Error::init(format!(
                "the grow store holds a plan of {} bytes instead of {PLAN_LEN}",
                b.len()
            ))
        })?;
        let word = |i: usize| {
            let mut w = [0; 8];
            w.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(w)
        };
        let plan = Plan {
            members: usize::try_from(word(0)).unwrap_or(usize::MAX),
            added: usize::try_from(word(8)).unwrap_or(usize::MAX),
            id: word(16),
            epoch: u32::from_le_bytes([b[24], b[25], b[26], b[27]]),
        };
        if plan.members == 0 || plan.added == 0 || plan.members.checked_add(plan.added).is_none() {
            return Err(Error::init(format!(
                "the grow store holds a malformed plan {plan:?}"
            )));
        }
        Ok(plan)
    }
}

/// The secret a process with no job secret (a world of one without a launcher) makes its
/// tokens' keys with: random, made once.
fn own_secret() -> Result<&'static [u8]> {
    static SECRET: OnceLock<[u8; 32]> = OnceLock::new();
    if let Some(s) = SECRET.get() {
        return Ok(s);
    }
    let mut s = [0u8; 32];
    getrandom::fill(&mut s).map_err(|e| {
        Error::init(format!(
            "could not get random bytes from the operating system for a join token: {e}"
        ))
    })?;
    Ok(SECRET.get_or_init(|| s))
}

impl World {
    /// Refuses to grow a world whose traffic goes through a transport plug-in: a plug-in
    /// serves one world of a process at a time, and the grown communicator is a world of its
    /// own while this one goes on, so it could not have the plug-in.
    fn check_growable(&self, what: &str) -> Result<()> {
        match self.config.transport.as_deref() {
            Some(name) if !plugin::BUILT_IN.contains(&name) => {
                Err(Error::invalid_argument(format!(
                    "{what}: this communicator's traffic goes through the transport plug-in \
                     {name:?} (HCOMM_TRANSPORT), and a grown communicator cannot have it: it is \
                     a world of its own while this one lives, and a plug-in serves one world of \
                     a process at a time; grow a job that runs on the built-in transports \
                     (HCOMM_TRANSPORT unset, shm, tcp or ofi)"
                )))
            }
            _ => Ok(()),
        }
    }

    /// The secret this world's join tokens derive from: the job secret, or in a world of one
    /// without one a random secret of this process.
    fn token_secret(&self) -> Result<&[u8]> {
        match &self.config.job_secret {
            Some(s) => Ok(s.expose()),
            None => own_secret(),
        }
    }

    /// The address of this rank that new processes reach: the one it announces, else (a
    /// world of one) that of its first rail, else the loopback address.
    fn reachable_ip(&self) -> IpAddr {
        self.announce
            .or_else(|| {
                rail_addrs(&self.config)
                    .ok()
                    .and_then(|r| r.first().map(|(_, ip)| *ip))
            })
            .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST))
    }
}

/// `config` for rank `rank` of `size` of a world grown with `token`: the token's store and
/// key instead of the job's, and no launcher pipe (hcommrun's rank numbers are not this
/// world's).
fn grown_config(mut config: Config, token: &Token, rank: usize, size: usize) -> Config {
    config.launch.rank = rank;
    config.launch.size = size;
    config.launch.local_rank = None;
    config.launch.root_addr = Some(token.addr.clone());
    config.job_secret = Some(token.secret());
    config.run_fd = None;
    config
}

/// How a rank of a world grown with `token` meets the others: through `client` (connected to
/// the token's store), hosting `store` if it made the token.
fn boot(token: &Token, client: StoreClient, store: Option<RendezvousStore>) -> Boot {
    let secret = token.secret();
    Boot {
        client,
        store,
        shm_id: link::job_id(secret.expose(), &token.addr, 0),
        secret,
        ns: NS.to_owned(),
    }
}

/// Connects to the grow store of `token`, within `timeout`.
fn connect(token: &Token, timeout: std::time::Duration) -> Result<StoreClient> {
    StoreClient::connect(&token.addr, token.secret().expose(), timeout).map_err(|e| {
        e.prefixed(format!(
            "the store of the join token at {} (hosted by the member that made the token) \
             cannot be reached (the member is gone, or the token expired: HCOMM_TIMEOUT after \
             it was made, no grow had taken it) or refused the token's key",
            token.addr
        ))
    })
}

impl Communicator {
    /// Makes a single-use token with which [`Communicator::grow`] adds new processes to this
    /// communicator, each of which calls [`Communicator::join`] with it. Local: only this
    /// rank makes it; hand it to the other members (for example with a broadcast) and to the
    /// new processes. This rank hosts the store the new processes reach until a grow uses
    /// the token; a token no grow on this rank has taken within `HCOMM_TIMEOUT` expires (its
    /// store closes; a grow with it fails), and releasing the communicator closes the stores
    /// of its tokens too. The token (at most [`JOIN_TOKEN_MAX`] bytes of ASCII) carries a key
    /// derived from the job secret: whoever holds it can join, without the job secret; keep
    /// it as secret as the job secret.
    ///
    /// Errors: [`Error::Transport`] when the store cannot listen; [`Error::Init`] without
    /// random bytes from the operating system; [`Error::InvalidArgument`] when the traffic
    /// goes through a transport plug-in (see [`Communicator::grow`]).
    pub fn join_token(&self) -> Result<String> {
        self.join_token_within(JOIN_TOKEN_MAX)
    }

    /// [`Communicator::join_token`] when the token must fit in `capacity` bytes: checked
    /// before anything starts, against the longest token this rank can make (its address
    /// with a port of five digits), so that a buffer too small costs nothing.
    ///
    /// Errors: [`Error::InvalidArgument`] when `capacity` is too small (the message says how
    /// many bytes it needs); those of [`Communicator::join_token`].
    pub fn join_token_within(&self, capacity: usize) -> Result<String> {
        self.world.check_growable("join_token")?;
        let ip = self.world.reachable_ip();
        let longest = Token {
            comm: self.id,
            nonce: [0; NONCE_LEN],
            key: [0; KEY_LEN],
            addr: SocketAddr::new(ip, u16::MAX).to_string(),
        }
        .encode()
        .len();
        if longest > capacity {
            return Err(Error::invalid_argument(format!(
                "join_token: the token may take {longest} bytes and only {capacity} fit \
                 (JOIN_TOKEN_MAX, {JOIN_TOKEN_MAX}, always does; in C HCOMM_JOIN_TOKEN_MAX \
                 counts the NUL too); nothing was started"
            )));
        }
        let mut nonce = [0u8; NONCE_LEN];
        getrandom::fill(&mut nonce).map_err(|e| {
            Error::init(format!(
                "could not get random bytes from the operating system for a join token: {e}"
            ))
        })?;
        let secret = self.world.token_secret()?;
        let key: [u8; KEY_LEN] = key_mac(secret, self.id, &nonce)?
            .finalize()
            .into_bytes()
            .into();
        let token = Token {
            comm: self.id,
            nonce,
            key,
            addr: String::new(),
        };
        let store = RendezvousStore::bind(SocketAddr::new(ip, 0), token.secret().expose())?;
        if let Some(at) = Instant::now().checked_add(self.world.config.timeout) {
            store.expire_at(at);
        }
        let token = Token {
            addr: SocketAddr::new(ip, store.local_addr().port()).to_string(),
            ..token
        };
        let mut g = lock(&self.state.grow);
        g.prune();
        g.stores.insert(nonce, store);
        Ok(token.encode())
    }

    /// Grows the communicator by `nnew` processes, each of which calls
    /// [`Communicator::join`] with `token`: returns a communicator of the members, ranks 0 to
    /// size - 1 in their old order, and the new processes, ranks size to size + nnew - 1 in
    /// the order they joined, at the next epoch. Collective: every member calls it with the
    /// same token (made by one of them with [`Communicator::join_token`]) and count. The
    /// grown communicator is a world of its own (the old one goes on until released); so a
    /// communicator whose traffic goes through a transport plug-in (which serves one world at
    /// a time) cannot grow, nor make a token: both fail at once with
    /// [`Error::InvalidArgument`] naming the plug-in.
    ///
    /// Errors: [`Error::InvalidArgument`] for a malformed token, one made for another
    /// communicator, one not made in this job (its key does not derive from the job secret),
    /// one a grow of this communicator already used, one that expired before the member that
    /// made it called grow, and `nnew` 0; [`Error::Mismatch`] when
    /// members pass other tokens or counts; [`Error::Timeout`] when the new processes do not
    /// all join within `HCOMM_TIMEOUT`; those of communication with the members.
    pub fn grow(&self, token: &str, nnew: usize) -> Result<Communicator> {
        self.world.check_growable("grow")?;
        // Whitespace around the token (a newline read with it) is no part of it.
        let token = token.trim();
        let t = Token::parse(token)?;
        if t.comm != self.id {
            return Err(Error::invalid_argument(format!(
                "grow: the join token was made for another communicator (id {:016x}, this \
                 one's is {:016x}): make one with join_token on this communicator",
                t.comm, self.id
            )));
        }
        key_mac(self.world.token_secret()?, t.comm, &t.nonce)?
            .verify_slice(&t.key)
            .map_err(|_| {
                Error::invalid_argument(
                    "grow: the join token was not made in this job: its key does not derive \
                     from the job secret",
                )
            })?;
        if nnew == 0 {
            return Err(Error::invalid_argument(
                "grow: nnew is 0: a grow adds at least one process",
            ));
        }
        let store = {
            let mut g = lock(&self.state.grow);
            if !g.used.insert(t.nonce) {
                return Err(Error::invalid_argument(
                    "grow: the join token was already used (a token grows a communicator \
                     once): make a new one with join_token",
                ));
            }
            g.take(&t.nonce)
        };
        // Every member holds the same token and count; the maker says if it expired.
        let mut h = Sha256::new();
        h.update(token.as_bytes());
        h.update((nnew as u64).to_le_bytes());
        let mut mine = [0u8; 16];
        mine.copy_from_slice(&h.finalize()[..16]);
        if store.is_err() {
            mine = EXPIRED;
        }
        let all = self.exchange_all(&mine)?;
        if let Some(r) = all.iter().position(|d| *d == EXPIRED) {
            return Err(Error::invalid_argument(format!(
                "grow: the join token expired: rank {r}, which made it, did not grow with it \
                 within HCOMM_TIMEOUT ({:?}) and closed its store: make a new one with \
                 join_token",
                self.world.config.timeout
            )));
        }
        // An expired token returned above: its maker's record says so.
        let store = store.unwrap_or_default();
        if let Some(r) = all.iter().position(|d| *d != mine) {
            return Err(Error::mismatch(format!(
                "grow: rank {r} passed another join token or count than this rank ({nnew})"
            ))
            .with_peer(PeerRank::ranks(r, self.members[r])));
        }
        let members = self.size();
        let size = members
            .checked_add(nnew)
            .ok_or_else(|| Error::invalid_argument(format!("grow: nnew {nnew} is too large")))?;
        let mut nonce = [0u8; 8];
        nonce.copy_from_slice(&t.nonce[..8]);
        let h = mix(self.id ^ mix(GROW_DOMAIN ^ u64::from_le_bytes(nonce)));
        let plan = Plan {
            members,
            added: nnew,
            id: (h & !(INTERNAL | COLL)).max(WORLD_ID + 1),
            epoch: self.epoch + 1,
        };
        let config = grown_config(self.world.config.clone(), &t, self.rank, size);
        let (world, topology) = World::start(config, |config, _| {
            let mut client = connect(&t, config.timeout)?;
            if self.rank == 0 {
                client.set(PLAN, &plan.encode())?;
            }
            Ok(boot(&t, client, store))
        })
        .map_err(|e| e.prefixed("grow: starting the grown communicator"))?;
        Ok(Communicator::of_world(world, topology, plan.id, plan.epoch))
    }

    /// Joins a communicator that its members grow with `token` ([`Communicator::grow`]): this
    /// process gets the next free rank of the grown communicator. Needs no launcher and no
    /// job secret: the token authenticates it; the other settings come from the environment
    /// as for [`Communicator::init`].
    ///
    /// Errors: [`Error::InvalidArgument`] for a malformed token, and for one already used
    /// (every rank its grow adds is taken); [`Error::Timeout`] when the token's store cannot be
    /// reached or the members do not grow within `HCOMM_TIMEOUT`; [`Error::Init`] when the
    /// store refuses the token's key (a forged or altered token).
    pub fn join(token: &str) -> Result<Communicator> {
        Communicator::join_with(Config::from_env()?, token)
    }

    /// [`Communicator::join`] with the settings of `config` (its launch information and job
    /// secret are not used).
    pub fn join_with(config: Config, token: &str) -> Result<Communicator> {
        let t = Token::parse(token.trim())?;
        let mut client = connect(&t, config.timeout)?;
        let plan = Plan::decode(&client.wait(PLAN, config.timeout)?)?;
        // The counter's new value: 1 for the first process; 0 only if a holder of the key
        // set it below 0 (which would give it a member's rank).
        let taken = usize::try_from(client.add(CLAIMED, 1)?).unwrap_or(0);
        if taken == 0 {
            return Err(Error::init(
                "join: the grow store's count of the ranks taken is malformed",
            ));
        }
        if taken > plan.added {
            return Err(Error::invalid_argument(format!(
                "join: the join token was already used: the {} rank(s) its grow adds are taken",
                plan.added
            )));
        }
        let rank = plan.members + taken - 1;
        let config = grown_config(config, &t, rank, plan.members + plan.added);
        let (world, topology) = World::start(config, |_, _| Ok(boot(&t, client, None)))
            .map_err(|e| e.prefixed("join: starting the grown communicator"))?;
        Ok(Communicator::of_world(world, topology, plan.id, plan.epoch))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token() -> Token {
        Token {
            comm: 0x1234_5678_9abc_def0,
            nonce: [7; NONCE_LEN],
            key: [0xa5; KEY_LEN],
            addr: "[fe80::1]:41234".to_owned(),
        }
    }

    #[test]
    fn a_token_round_trips_and_fits_the_limit() {
        let t = token();
        let s = t.encode();
        assert!(s.len() <= JOIN_TOKEN_MAX, "{} bytes", s.len());
        let back = Token::parse(&s).expect("valid");
        assert_eq!(
            (back.comm, back.nonce, back.key, back.addr),
            (t.comm, t.nonce, t.key, t.addr)
        );
    }

    #[test]
    fn malformed_tokens_are_refused() {
        let good = token().encode();
        for bad in [
            String::new(),
            "hcomm-join/2/00/00/00/x".to_owned(),
            good.replacen("hcomm-join/1/", "hcomm-join/1/zz", 1),
            good.rsplit_once('/')
                .map(|(a, _)| a.to_owned())
                .unwrap_or_default(),
            format!("{good}{}", "9".repeat(JOIN_TOKEN_MAX)),
        ] {
            let err = Token::parse(&bad).err().expect("refused");
            assert!(matches!(err, Error::InvalidArgument(_)), "{bad:?}: {err:?}");
        }
        // The error does not repeat the key of a token that is almost right.
        let no_addr = format!("{}/", good.rsplit_once('/').map(|(a, _)| a).unwrap_or(""));
        let err = Token::parse(&no_addr).err().expect("refused");
        let key = hex::encode([0xa5; KEY_LEN]);
        assert!(!err.to_string().contains(&key), "{err}");
    }

    #[test]
    fn the_key_depends_on_the_secret_the_communicator_and_the_nonce() {
        let key = |secret: &[u8], comm, nonce: &[u8; NONCE_LEN]| -> [u8; KEY_LEN] {
            key_mac(secret, comm, nonce)
                .expect("mac")
                .finalize()
                .into_bytes()
                .into()
        };
        let k = key(b"job", 5, &[1; NONCE_LEN]);
        assert_ne!(k, key(b"other job", 5, &[1; NONCE_LEN]));
        assert_ne!(k, key(b"job", 6, &[1; NONCE_LEN]));
        assert_ne!(k, key(b"job", 5, &[2; NONCE_LEN]));
        assert!(key_mac(b"job", 5, &[1; NONCE_LEN])
            .expect("mac")
            .verify_slice(&k)
            .is_ok());
    }

    #[test]
    fn a_plan_round_trips_and_a_malformed_one_is_refused() {
        let p = Plan {
            members: 5,
            added: 1,
            id: 99,
            epoch: 2,
        };
        assert_eq!(Plan::decode(&p.encode()).expect("valid"), p);
        assert!(Plan::decode(&[0; 5]).is_err());
        let mut zero = p;
        zero.added = 0;
        assert!(Plan::decode(&zero.encode()).is_err());
    }
}
