//! The TCP rendezvous: rank 0 listens on MASTER_PORT, every other rank connects (retrying
//! with backoff), says who it is, and gets rank 0's unique id. Every wait ends at one
//! deadline (`--rendezvous-timeout`): a rank that never arrives is named in rank 0's error,
//! and rank 0 tells the ranks that did arrive to stop; a rank 0 that never answers is named
//! in every other rank's error.

use super::env::RankEnv;
use super::unique_id::{NewId, UniqueId};
use super::wire::{Message, WireError};
use super::{LaunchError, LaunchInfo};
use std::collections::BTreeMap;
use std::io::ErrorKind;
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// What a rank holds after the rendezvous.
#[derive(Debug)]
pub enum Role {
    /// A world of one: no connection.
    Single,
    /// Rank 0: one connection per other rank, by rank.
    Server { peers: BTreeMap<u32, TcpStream> },
    /// Another rank: its connection to rank 0.
    Client { stream: TcpStream },
}

/// The rank's launch information and its connections.
#[derive(Debug)]
pub struct Joined {
    pub info: LaunchInfo,
    pub role: Role,
}

/// Meets the other ranks: rank 0 serves `id` (created by the caller), the others fetch it.
pub fn rendezvous(env: &RankEnv, timeout: Duration, new_id: NewId) -> Result<Joined, LaunchError> {
    let deadline = Instant::now() + timeout;
    let info = |id: UniqueId| LaunchInfo {
        rank: env.rank,
        world_size: env.world_size,
        local_rank: env.local_rank,
        local_world_size: env.local_world_size,
        node_rank: env.node_rank,
        nnodes: env.nnodes,
        master_addr: env.master_addr.clone(),
        master_port: env.master_port,
        unique_id: id.bytes,
        id_source: id.source,
    };
    if env.world_size == 1 {
        let id = new_id().map_err(LaunchError::Protocol)?;
        return Ok(Joined {
            info: info(id),
            role: Role::Single,
        });
    }
    if env.rank == 0 {
        let id = new_id()
            .map_err(|e| LaunchError::Protocol(format!("rank 0 could not create the id: {e}")))?;
        let listener =
            TcpListener::bind(("0.0.0.0", env.master_port)).map_err(|source| LaunchError::Io {
                what: "rank 0 could not listen on MASTER_PORT (is another run or torchrun's store on it? pass --master-port)".into(),
                addr: format!("0.0.0.0:{}", env.master_port),
                source,
            })?;
        let peers = serve(&listener, env, &id, deadline, timeout)?;
        Ok(Joined {
            info: info(id),
            role: Role::Server { peers },
        })
    } else {
        let (stream, id) = fetch(env, deadline, timeout)?;
        Ok(Joined {
            info: info(id),
            role: Role::Client { stream },
        })
    }
}

fn remaining(deadline: Instant) -> Option<Duration> {
    deadline
        .checked_duration_since(Instant::now())
        .filter(|d| !d.is_zero())
}

/// Sends `Stop` to every connection, ignoring failures (the peer may be gone already).
pub fn stop_all<'a>(streams: impl IntoIterator<Item = &'a mut TcpStream>, message: &str) {
    for s in streams {
        let _ = s.set_write_timeout(Some(Duration::from_secs(2)));
        let _ = Message::Stop {
            message: message.to_string(),
        }
        .write_to(s);
    }
}

/// A `Hello` from a freshly accepted connection.
type Arrival = (TcpStream, SocketAddr, Result<Message, WireError>);

/// Rank 0: accepts every other rank before `deadline`, then sends each the id.
pub fn serve(
    listener: &TcpListener,
    env: &RankEnv,
    id: &UniqueId,
    deadline: Instant,
    timeout: Duration,
) -> Result<BTreeMap<u32, TcpStream>, LaunchError> {
    let addr = format!("{}:{}", env.master_addr, env.master_port);
    let io = |what: &str, source| LaunchError::Io {
        what: what.into(),
        addr: addr.clone(),
        source,
    };
    listener
        .set_nonblocking(true)
        .map_err(|e| io("listen", e))?;
    let (tx, rx) = mpsc::channel::<Arrival>();
    let mut peers: BTreeMap<u32, TcpStream> = BTreeMap::new();
    let fail = |peers: &mut BTreeMap<u32, TcpStream>, err: LaunchError| {
        stop_all(peers.values_mut(), &err.to_string());
        Err(err)
    };
    while peers.len() + 1 < env.world_size as usize {
        let Some(left) = remaining(deadline) else {
            let err = LaunchError::MissingRanks {
                addr: addr.clone(),
                timeout_s: timeout.as_secs_f64(),
                missing: missing_ranks(env.world_size, &peers),
                world_size: env.world_size,
            };
            return fail(&mut peers, err);
        };
        match listener.accept() {
            Ok((stream, from)) => {
                let tx = tx.clone();
                // Read the hello on a thread of its own, so a silent connection cannot hold up
                // the others; the read ends at the deadline.
                std::thread::spawn(move || {
                    let mut s = stream;
                    let read = s
                        .set_nonblocking(false)
                        .and_then(|_| s.set_read_timeout(Some(left)))
                        .map_err(WireError::Io)
                        .and_then(|_| Message::read_from(&mut s));
                    let _ = tx.send((s, from, read));
                });
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return fail(&mut peers, io("accept", e)),
        }
        while let Ok((stream, from, read)) = rx.try_recv() {
            match admit(env, stream, from, read, &peers) {
                Ok(Some((rank, s))) => {
                    peers.insert(rank, s);
                }
                Ok(None) => {}
                Err(e) => return fail(&mut peers, e),
            }
        }
        if peers.len() + 1 < env.world_size as usize {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    for (rank, s) in peers.iter_mut() {
        let sent = s
            .set_write_timeout(remaining(deadline).or(Some(Duration::from_millis(100))))
            .map_err(WireError::Io)
            .and_then(|_| {
                Message::Id {
                    id: id.bytes,
                    source: id.source,
                }
                .write_to(s)
            });
        if let Err(e) = sent {
            let err = LaunchError::Protocol(format!("sending the id to rank {rank}: {e}"));
            return fail(&mut peers, err);
        }
    }
    Ok(peers)
}

/// The ranks of 1..world_size not in `peers`: the first 32 by number, then how many more
/// (a world of 2^32 - 1 must not build four billion strings).
fn missing_ranks(world_size: u32, peers: &BTreeMap<u32, TcpStream>) -> String {
    const SHOWN: usize = 32;
    let total = world_size as usize - 1 - peers.len();
    let mut names: Vec<String> = (1..world_size)
        .filter(|r| !peers.contains_key(r))
        .take(SHOWN)
        .map(|r| r.to_string())
        .collect();
    if total > SHOWN {
        names.push(format!("and {} more", total - SHOWN));
    }
    names.join(", ")
}

/// Checks a hello: `Ok(None)` drops a connection that is no parsim peer (a port scanner, a
/// closed socket); a parsim peer of another version or world, or a rank twice, is fatal.
fn admit(
    env: &RankEnv,
    mut stream: TcpStream,
    from: SocketAddr,
    read: Result<Message, WireError>,
    peers: &BTreeMap<u32, TcpStream>,
) -> Result<Option<(u32, TcpStream)>, LaunchError> {
    let refuse = |stream: &mut TcpStream, why: String| {
        stop_all([stream], &why);
        Err(LaunchError::Protocol(why))
    };
    match read {
        Ok(Message::Hello { rank, world_size }) => {
            if world_size != env.world_size {
                let why = format!("rank {rank} at {from} has world size {world_size}, rank 0 has {} (WORLD_SIZE / SLURM_NTASKS differ between processes)", env.world_size);
                return refuse(&mut stream, why);
            }
            if rank == 0 || rank >= env.world_size {
                let why = format!(
                    "a process at {from} claims rank {rank}, not in 1..{} (rank 0 is this process)",
                    env.world_size
                );
                return refuse(&mut stream, why);
            }
            if peers.contains_key(&rank) {
                let why = format!("two processes claim rank {rank} (the second from {from}): RANK / SLURM_PROCID repeated");
                return refuse(&mut stream, why);
            }
            Ok(Some((rank, stream)))
        }
        Ok(other) => refuse(
            &mut stream,
            format!("a peer at {from} sent {other:?} before its hello"),
        ),
        Err(WireError::Protocol(m)) if m.contains("version") => {
            refuse(&mut stream, format!("a peer at {from}: {m}"))
        }
        // Not a parsim peer, or one that went away: ignore it.
        Err(_) => Ok(None),
    }
}

/// Another rank: connects to rank 0 (retrying with backoff until the deadline), says hello,
/// and waits for the id.
pub fn fetch(
    env: &RankEnv,
    deadline: Instant,
    timeout: Duration,
) -> Result<(TcpStream, UniqueId), LaunchError> {
    let addr = format!("{}:{}", env.master_addr, env.master_port);
    let no_rank_zero = |what: String| LaunchError::NoRankZero {
        rank: env.rank,
        addr: addr.clone(),
        what,
        timeout_s: timeout.as_secs_f64(),
    };
    let mut stream = connect(&addr, deadline).map_err(|last| {
        no_rank_zero(format!("never accepted a connection (last error: {last})"))
    })?;
    let hello = Message::Hello {
        rank: env.rank,
        world_size: env.world_size,
    };
    let left = remaining(deadline).unwrap_or(Duration::from_millis(1));
    stream
        .set_write_timeout(Some(left))
        .and_then(|_| stream.set_read_timeout(Some(left)))
        .map_err(|source| LaunchError::Io {
            what: "socket options".into(),
            addr: addr.clone(),
            source,
        })?;
    hello
        .write_to(&mut stream)
        .map_err(|e| no_rank_zero(format!("did not take the hello ({e})")))?;
    match Message::read_from(&mut stream) {
        Ok(Message::Id { id, source }) => Ok((stream, UniqueId { bytes: id, source })),
        Ok(Message::Stop { message }) => Err(LaunchError::Stopped(message)),
        Ok(other) => Err(LaunchError::Protocol(format!(
            "rank 0 sent {other:?} instead of the id"
        ))),
        Err(WireError::Protocol(m)) => Err(LaunchError::Protocol(format!("rank 0 at {addr}: {m}"))),
        Err(WireError::Io(e))
            if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) =>
        {
            Err(no_rank_zero(
                "accepted the connection but sent no id (still waiting for other ranks?)".into(),
            ))
        }
        Err(WireError::Io(e)) => Err(no_rank_zero(format!(
            "closed the connection before sending the id ({e})"
        ))),
    }
}

/// Connects to `addr`, retrying with exponential backoff (50 ms doubling to 1 s) until the
/// deadline; the error is the last failure's text.
fn connect(addr: &str, deadline: Instant) -> Result<TcpStream, String> {
    let mut backoff = Duration::from_millis(50);
    loop {
        if remaining(deadline).is_none() {
            return Err("no attempt finished before the deadline".into());
        }
        // Every address the name resolves to (`localhost` may give ::1 before 127.0.0.1).
        let attempt = addr
            .to_socket_addrs()
            .map_err(|e| format!("cannot resolve {addr}: {e}"))
            .and_then(|addrs| {
                let mut last = format!("{addr} resolves to no address");
                for a in addrs {
                    let left = remaining(deadline).unwrap_or(Duration::from_millis(1));
                    match TcpStream::connect_timeout(&a, left.min(Duration::from_secs(5))) {
                        Ok(s) => return Ok(s),
                        Err(e) => last = format!("{a}: {e}"),
                    }
                }
                Err(last)
            });
        match attempt {
            Ok(s) => return Ok(s),
            Err(e) => {
                let Some(left) = remaining(deadline) else {
                    return Err(e);
                };
                std::thread::sleep(backoff.min(left));
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::EnvSource;
    use crate::unique_id::IdSource;
    use std::io::Write;

    fn env(rank: u32, world_size: u32, port: u16) -> RankEnv {
        RankEnv {
            rank,
            world_size,
            local_rank: rank,
            local_world_size: world_size,
            node_rank: 0,
            nnodes: 1,
            master_addr: "127.0.0.1".into(),
            master_port: port,
            source: EnvSource::Torchrun,
        }
    }

    fn listener() -> (TcpListener, u16) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        (l, port)
    }

    const T: Duration = Duration::from_secs(3);

    /// Rank 0's error serving `me` with a stand-in id, as shown.
    fn serve_refusal(l: &TcpListener, me: &RankEnv) -> String {
        serve(l, me, &UniqueId::stand_in(), Instant::now() + T, T)
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn every_rank_gets_rank_zeros_id() {
        let (l, port) = listener();
        let id = UniqueId::stand_in();
        let clients: Vec<_> = (1..4)
            .map(|r| std::thread::spawn(move || fetch(&env(r, 4, port), Instant::now() + T, T)))
            .collect();
        let peers = serve(&l, &env(0, 4, port), &id, Instant::now() + T, T).unwrap();
        assert_eq!(peers.keys().copied().collect::<Vec<_>>(), [1, 2, 3]);
        for c in clients {
            let (_, got) = c.join().unwrap().unwrap();
            assert_eq!(got, id);
            assert_eq!(got.source, IdSource::StandIn);
        }
    }

    #[test]
    fn a_missing_peer_is_named_and_the_others_are_stopped() {
        let (l, port) = listener();
        let short = Duration::from_millis(800);
        let c = std::thread::spawn(move || fetch(&env(2, 4, port), Instant::now() + T, T));
        let start = Instant::now();
        let e = serve(
            &l,
            &env(0, 4, port),
            &UniqueId::stand_in(),
            Instant::now() + short,
            short,
        )
        .unwrap_err()
        .to_string();
        assert!(start.elapsed() < short + Duration::from_secs(2));
        assert!(e.contains("rank(s) 1, 3 of 4 never connected"), "{e}");
        // Rank 2 arrived and is told why the run stops.
        let e2 = c.join().unwrap().unwrap_err().to_string();
        assert!(
            e2.contains("stopped by rank 0") && e2.contains("1, 3"),
            "{e2}"
        );
    }

    #[test]
    fn a_huge_world_names_a_few_missing_ranks() {
        let empty = BTreeMap::new();
        // Ranks 1..=2^32 - 2 are missing: 2^32 - 2 of them, 32 named.
        let m = missing_ranks(u32::MAX, &empty);
        assert!(
            m.starts_with("1, 2, 3,") && m.ends_with(", 32, and 4294967262 more"),
            "{m}"
        );
        assert_eq!(missing_ranks(4, &empty), "1, 2, 3");
    }

    #[test]
    fn a_missing_rank_zero_is_named_within_the_timeout() {
        let (l, port) = listener();
        drop(l); // nobody listens on the port now
        let short = Duration::from_millis(700);
        let start = Instant::now();
        let e = fetch(&env(1, 2, port), Instant::now() + short, short)
            .unwrap_err()
            .to_string();
        assert!(
            start.elapsed() < short + Duration::from_secs(2),
            "{:?}",
            start.elapsed()
        );
        assert!(
            e.contains("rank 1: rank 0 at 127.0.0.1:") && e.contains("never accepted"),
            "{e}"
        );
    }

    #[test]
    fn a_silent_rank_zero_ends_at_the_deadline() {
        // Accepts and says nothing.
        let (l, port) = listener();
        let short = Duration::from_millis(600);
        let e = fetch(&env(1, 2, port), Instant::now() + short, short)
            .unwrap_err()
            .to_string();
        assert!(e.contains("sent no id"), "{e}");
        drop(l);
    }

    #[test]
    fn wrong_peers_are_ignored_or_refused() {
        let (l, port) = listener();
        // A stranger (HTTP) is ignored; the real rank 1 then completes the rendezvous.
        let stranger = std::thread::spawn(move || {
            let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
            s.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
            std::thread::sleep(Duration::from_millis(200));
            fetch(&env(1, 2, port), Instant::now() + T, T)
        });
        serve(
            &l,
            &env(0, 2, port),
            &UniqueId::stand_in(),
            Instant::now() + T,
            T,
        )
        .unwrap();
        assert!(stranger.join().unwrap().is_ok());

        // A rank of another world size is refused, and told why.
        let (l, port) = listener();
        let other = std::thread::spawn(move || fetch(&env(1, 8, port), Instant::now() + T, T));
        let e = serve_refusal(&l, &env(0, 2, port));
        assert!(e.contains("world size 8, rank 0 has 2"), "{e}");
        let e1 = other.join().unwrap().unwrap_err().to_string();
        assert!(e1.contains("world size 8"), "{e1}");

        // A rank claimed twice.
        let (l, port) = listener();
        let twins: Vec<_> = (0..2)
            .map(|_| std::thread::spawn(move || fetch(&env(1, 3, port), Instant::now() + T, T)))
            .collect();
        let e = serve_refusal(&l, &env(0, 3, port));
        assert!(e.contains("two processes claim rank 1"), "{e}");
        for t in twins {
            assert!(t.join().unwrap().is_err());
        }

        // Another protocol version is refused with the versions named.
        let (l, port) = listener();
        let old = std::thread::spawn(move || {
            let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
            let mut b = Message::Hello {
                rank: 1,
                world_size: 2,
            }
            .encode();
            b[4] = 9;
            s.write_all(&b).unwrap();
            std::thread::sleep(Duration::from_millis(300));
        });
        let e = serve_refusal(&l, &env(0, 2, port));
        assert!(e.contains("protocol version 9"), "{e}");
        old.join().unwrap();
    }
}
