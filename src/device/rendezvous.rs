//! The rendezvous of a run over several processes (`--world-size W --rank R --rendezvous HOST:PORT`), as
//! torchrun's: before NCCL can connect the ranks, every rank must learn NCCL's unique id, which rank 0
//! creates. Rank 0 listens on HOST:PORT; every other rank connects (retrying until rank 0 is up) and says
//! who it is and what it runs; rank 0 checks that the W − 1 others all came, each rank once, with its own
//! textnet version and training flags, and then sends each the id, or the one-line reason the run cannot
//! start (then every rank fails with it, not only rank 0).
//!
//! The protocol is one text line each way over TCP, so that a stray client gets a readable answer:
//!
//! ```text
//! rank → 0:  textnet-rendezvous 1 rank=R world=W version=V flags=F\n
//! 0 → rank:  ok ID\n          (ID the unique id in hexadecimal)
//!            error MESSAGE\n
//! ```
//!
//! `flags` is the caller's fingerprint of what must agree across ranks (the model's sizes and the training
//! flags); it is compared as an opaque string, without spaces.
//!
//! The connections stay open for the run (`Meeting::watch`): rank 0 holds one to every rank, each rank
//! one to rank 0, and each side says `alive` every few seconds. A process that dies (`kill -9`, a crash,
//! an error that ends it) closes its side, and the one it was linked to stops at once with a line naming
//! it; a silent link (a host gone) stops it after `SILENCE`. Rank 0 stopping then stops every other rank
//! the same way, so no rank waits forever in an all-reduce its peer will never join. A rank that ends
//! normally says `done` first.

use anyhow::{Context, Result, anyhow, bail};
use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const MAGIC: &str = "textnet-rendezvous";
const PROTOCOL: u32 = 1;
/// How long a rank waits between attempts to reach rank 0, and for one attempt.
const RETRY: Duration = Duration::from_millis(100);
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
/// How much longer than its timeout a rank waits for rank 0's verdict once connected.
const VERDICT_GRACE: Duration = Duration::from_secs(1);
/// How long rank 0 waits for the hello of one connection (a rank sends it as soon as it connects): a
/// client that stays silent (a port check, a stray `nc`) is dropped after it, and rank 0 goes on waiting.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest line either side accepts.
const MAX_LINE: usize = 4096;
/// How often a linked rank says it is alive.
const HEARTBEAT: Duration = Duration::from_secs(2);
/// How long a link may stay silent before the rank at its other end counts as gone.
pub const SILENCE: Duration = Duration::from_secs(30);

/// A rendezvous that succeeded: the run's unique id, and the open links to the other ranks (rank 0: one
/// to each other rank; the others: one to rank 0), each with the rank at its other end.
pub struct Meeting {
    /// NCCL's unique id of the run.
    pub id: Vec<u8>,
    links: Vec<(usize, TcpStream)>,
}

/// Where and as whom one process joins a run.
#[derive(Clone, Debug)]
pub struct Rendezvous {
    /// The number of processes.
    pub world_size: usize,
    /// This process's rank, below `world_size`.
    pub rank: usize,
    /// Rank 0's address (`HOST:PORT`), where it listens and the others connect.
    pub address: String,
    /// How long any rank waits for the others before it gives up.
    pub timeout: Duration,
}

/// What a rank says of itself.
#[derive(Clone, Debug, PartialEq)]
struct Hello {
    rank: usize,
    world_size: usize,
    version: String,
    flags: String,
}

impl Hello {
    fn line(&self) -> String {
        let Hello { rank, world_size, version, flags } = self;
        format!("{MAGIC} {PROTOCOL} rank={rank} world={world_size} version={version} flags={flags}\n")
    }

    fn parse(line: &str) -> Result<Hello> {
        let mut words = line.split_whitespace();
        if words.next() != Some(MAGIC) {
            bail!("not a textnet rendezvous");
        }
        let protocol = words.next().unwrap_or_default();
        if protocol != PROTOCOL.to_string() {
            bail!("rendezvous protocol {protocol}, this textnet speaks {PROTOCOL}");
        }
        let mut field = |key: &str| -> Result<String> {
            let word = words.next().ok_or_else(|| anyhow!("no {key}"))?;
            word.strip_prefix(key)
                .and_then(|w| w.strip_prefix('='))
                .map(str::to_string)
                .ok_or_else(|| anyhow!("no {key}"))
        };
        let rank = field("rank")?.parse().context("rank")?;
        let world_size = field("world")?.parse().context("world")?;
        Ok(Hello { rank, world_size, version: field("version")?, flags: field("flags")? })
    }
}

impl Rendezvous {
    /// Checks the flags' values alone (no network): a world of at least one, a rank inside it, and an
    /// address of HOST:PORT.
    pub fn new(world_size: usize, rank: usize, address: &str, timeout: Duration) -> Result<Rendezvous> {
        if world_size == 0 {
            bail!("--world-size must be at least 1");
        }
        if rank >= world_size {
            bail!("--rank {rank} is not below --world-size {world_size}");
        }
        let (host, port) =
            address.rsplit_once(':').ok_or_else(|| anyhow!("--rendezvous {address}: expected HOST:PORT"))?;
        if host.is_empty() || port.parse::<u16>().map_or(true, |p| p == 0) {
            bail!("--rendezvous {address}: expected HOST:PORT with a port from 1 to 65535");
        }
        Ok(Rendezvous { world_size, rank, address: address.to_string(), timeout })
    }

    /// The line a rank prints as it starts to wait at the rendezvous, naming whom it waits for: "rank 1:
    /// waiting up to 300 s for rank 0 at HOST:PORT". None in a world of one, where nobody is waited for.
    pub fn waiting(&self) -> Option<String> {
        let whom = match (self.rank, self.world_size) {
            (_, 1) => return None,
            (0, 2) => "rank 1".to_string(),
            (0, world) => format!("ranks 1…{}", world - 1),
            _ => "rank 0".to_string(),
        };
        let (rank, seconds, address) = (self.rank, self.timeout.as_secs_f64(), &self.address);
        Some(format!("rank {rank}: waiting up to {seconds} s for {whom} at {address}"))
    }

    /// Meets the other ranks and returns the run's unique id: rank 0 makes it with `make_id` once every
    /// other rank has arrived and agreed (`version` and `flags` the same as rank 0's), and sends it to
    /// them; the others receive it. Any rank that cannot go on fails with a one-line error, and rank 0
    /// tells the ranks that arrived why.
    pub fn meet(&self, version: &str, flags: &str, make_id: impl FnOnce() -> Result<Vec<u8>>) -> Result<Meeting> {
        if version.contains(char::is_whitespace) || flags.contains(char::is_whitespace) || flags.is_empty() {
            bail!("internal: a rendezvous version or flags fingerprint with spaces");
        }
        let me = Hello { rank: self.rank, world_size: self.world_size, version: version.into(), flags: flags.into() };
        if self.rank == 0 { self.lead(&me, make_id) } else { self.join(&me) }
    }

    fn socket_address(&self) -> Result<SocketAddr> {
        self.address
            .to_socket_addrs()
            .with_context(|| format!("--rendezvous {}", self.address))?
            .next()
            .ok_or_else(|| anyhow!("--rendezvous {}: no such address", self.address))
    }

    fn lead(&self, me: &Hello, make_id: impl FnOnce() -> Result<Vec<u8>>) -> Result<Meeting> {
        let address = self.socket_address()?;
        let listener = TcpListener::bind(address).map_err(|e| match e.kind() {
            ErrorKind::AddrInUse => anyhow!("--rendezvous {}: the port is in use (rank 0 listens there)", self.address),
            _ => anyhow!("--rendezvous {}: rank 0 cannot listen there: {e}", self.address),
        })?;
        listener.set_nonblocking(true)?;
        let deadline = Instant::now() + self.timeout;
        let mut arrived: Vec<(Hello, TcpStream)> = Vec::new();
        let mut problem: Option<String> = None;
        // Once the run cannot start, rank 0 still waits for the rest (up to the timeout) to tell them why.
        let mut told = 0;
        while arrived.len() + told + 1 < self.world_size {
            match listener.accept() {
                Ok((mut stream, _)) => {
                    stream.set_nonblocking(false)?;
                    let remaining = deadline.saturating_duration_since(Instant::now()).max(RETRY);
                    match read_line(&stream, remaining.min(HELLO_TIMEOUT)).and_then(|l| Hello::parse(&l)) {
                        Ok(hello) => match &problem {
                            Some(message) => {
                                let _ = stream.write_all(format!("error {message}\n").as_bytes());
                                told += 1;
                            }
                            None => {
                                problem = disagreement(me, &hello, &arrived);
                                arrived.push((hello, stream));
                            }
                        },
                        // Not one of ours (a port scan, another program): answer it and keep waiting.
                        Err(e) => {
                            let _ = stream.write_all(format!("error {e:#}\n").as_bytes());
                        }
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    if Instant::now() < deadline {
                        std::thread::sleep(Duration::from_millis(10));
                        continue;
                    }
                    if problem.is_none() {
                        let missing: Vec<String> = (1..self.world_size)
                            .filter(|r| !arrived.iter().any(|(h, _)| h.rank == *r))
                            .map(|r| r.to_string())
                            .collect();
                        problem = Some(format!(
                            "rendezvous at {}: rank{} {} did not arrive within {} s",
                            self.address,
                            if missing.len() > 1 { "s" } else { "" },
                            missing.join(", "),
                            self.timeout.as_secs_f64()
                        ));
                    }
                    break;
                }
                Err(e) => return Err(anyhow!("rendezvous at {}: {e}", self.address)),
            }
        }
        let (reply, outcome) = match problem {
            Some(message) => (format!("error {message}\n"), Err(anyhow!(message))),
            None => {
                let id = make_id()?;
                (format!("ok {}\n", to_hex(&id)), Ok(id))
            }
        };
        for (_, stream) in &mut arrived {
            // A rank that has gone away since is no reason to fail the others.
            let _ = stream.write_all(reply.as_bytes());
        }
        let links = arrived.into_iter().map(|(hello, stream)| (hello.rank, stream)).collect();
        outcome.map(|id| Meeting { id, links })
    }

    fn join(&self, me: &Hello) -> Result<Meeting> {
        let address = self.socket_address()?;
        let deadline = Instant::now() + self.timeout;
        let mut stream = loop {
            match TcpStream::connect_timeout(&address, CONNECT_TIMEOUT) {
                Ok(stream) => break stream,
                Err(_) if Instant::now() + RETRY < deadline => std::thread::sleep(RETRY),
                Err(e) => bail!(
                    "rendezvous: rank 0 at {} did not answer within {} s ({e})",
                    self.address,
                    self.timeout.as_secs_f64()
                ),
            }
        };
        stream.write_all(me.line().as_bytes()).with_context(|| format!("rendezvous at {}", self.address))?;
        // Rank 0 was listening before this rank connected, so its verdict comes within its timeout of now.
        let line = read_line(&stream, self.timeout + VERDICT_GRACE)
            .with_context(|| format!("rendezvous at {}", self.address))?;
        if let Some(id) = line.strip_prefix("ok ") {
            Ok(Meeting { id: from_hex(id.trim_end())?, links: vec![(0, stream)] })
        } else if let Some(message) = line.strip_prefix("error ") {
            bail!("{}", message.trim_end())
        } else {
            bail!("rendezvous at {}: not a textnet rank 0 (it said {:?})", self.address, line.trim_end())
        }
    }
}

impl Meeting {
    /// Keeps watching the links for the rest of the run: every link gets `alive` every `HEARTBEAT`, and
    /// when the rank at a link's other end closes it without `done`, or stays silent for `SILENCE`,
    /// `gone(line)` runs with a one-line reason (a process ends there: see `exit_on_gone`).
    pub fn watch(self, me: usize, gone: fn(&str) -> !) -> Watch {
        let finished = Arc::new(AtomicBool::new(false));
        let mut writers = Vec::new();
        for (peer, stream) in self.links {
            let Ok(reader) = stream.try_clone() else {
                gone(&format!("rank {me}: cannot watch the link to rank {peer}"));
            };
            let done = finished.clone();
            std::thread::spawn(move || {
                let _ = reader.set_read_timeout(Some(SILENCE));
                let mut lines = BufReader::new(reader).lines();
                loop {
                    let why = match lines.next() {
                        Some(Ok(line)) if line == "done" => return,
                        Some(Ok(_)) => continue,
                        Some(Err(e)) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                            format!("was silent for {} s", SILENCE.as_secs())
                        }
                        Some(Err(e)) => format!("dropped its link ({e})"),
                        None => "ended without finishing (its process stopped)".to_string(),
                    };
                    if done.load(Ordering::SeqCst) {
                        return;
                    }
                    gone(&format!("rank {peer} {why}; rank {me} stops too"));
                }
            });
            writers.push(stream);
        }
        let beating = Arc::new(Mutex::new(writers));
        let heart = beating.clone();
        let done = finished.clone();
        std::thread::spawn(move || {
            while !done.load(Ordering::SeqCst) {
                for writer in heart.lock().unwrap_or_else(|p| p.into_inner()).iter_mut() {
                    let _ = writer.write_all(b"alive\n");
                }
                std::thread::sleep(HEARTBEAT);
            }
        });
        Watch { finished, writers: beating }
    }
}

/// The watch over a run's links (`Meeting::watch`); `finish` at the run's normal end.
pub struct Watch {
    finished: Arc<AtomicBool>,
    writers: Arc<Mutex<Vec<TcpStream>>>,
}

impl Watch {
    /// Tells the linked ranks that this one ends normally, and stops watching them.
    pub fn finish(self) {
        self.finished.store(true, Ordering::SeqCst);
        for writer in self.writers.lock().unwrap_or_else(|p| p.into_inner()).iter_mut() {
            let _ = writer.write_all(b"done\n");
            let _ = writer.flush();
        }
    }
}

/// A watch dropped without `finish` is a rank that stopped: its links close, as its process's would.
impl Drop for Watch {
    fn drop(&mut self) {
        if !self.finished.swap(true, Ordering::SeqCst) {
            for writer in self.writers.lock().unwrap_or_else(|p| p.into_inner()).iter() {
                let _ = writer.shutdown(std::net::Shutdown::Both);
            }
        }
    }
}

/// The process's end when a linked rank is gone: the reason on stderr as textnet's errors are, exit 1.
pub fn exit_on_gone(line: &str) -> ! {
    eprintln!("error: {line}");
    std::process::exit(1)
}

/// Why `hello` cannot join rank 0's run, given the ranks already `arrived`, if it cannot.
fn disagreement(me: &Hello, hello: &Hello, arrived: &[(Hello, TcpStream)]) -> Option<String> {
    let r = hello.rank;
    if hello.world_size != me.world_size {
        Some(format!("rank {r} was started with --world-size {}, rank 0 with {}", hello.world_size, me.world_size))
    } else if r == 0 || r >= me.world_size {
        Some(format!("a process joined as rank {r}, which is not in 1..{}", me.world_size))
    } else if arrived.iter().any(|(h, _)| h.rank == r) {
        Some(format!("two processes joined as rank {r}"))
    } else if hello.version != me.version {
        Some(format!("rank {r} runs textnet {}, rank 0 textnet {}", hello.version, me.version))
    } else if hello.flags != me.flags {
        let (theirs, ours) = differing_fields(&hello.flags, &me.flags);
        Some(format!("rank {r} was started with other training flags than rank 0 ({theirs} against {ours})"))
    } else {
        None
    }
}

/// The fields (comma-separated) in which two fingerprints of as many fields differ, or both whole.
fn differing_fields(a: &str, b: &str) -> (String, String) {
    let (fa, fb): (Vec<&str>, Vec<&str>) = (a.split(',').collect(), b.split(',').collect());
    if fa.len() != fb.len() {
        return (a.to_string(), b.to_string());
    }
    let (da, db): (Vec<&str>, Vec<&str>) = fa.iter().zip(&fb).filter(|(x, y)| x != y).unzip();
    (da.join(","), db.join(","))
}

/// One line, read until `timeout` passes in all (however slowly its bytes come). Read a byte at a time, so
/// that nothing after the line (the other side's first `alive`) is taken from the stream.
fn read_line(mut stream: &TcpStream, timeout: Duration) -> Result<String> {
    let deadline = Instant::now() + timeout;
    let timed_out = || anyhow!("no answer within {} s", timeout.as_secs_f64());
    let mut line = Vec::new();
    while line.last() != Some(&b'\n') {
        if line.len() == MAX_LINE {
            bail!("a line longer than {MAX_LINE} bytes");
        }
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return Err(timed_out());
        }
        stream.set_read_timeout(Some(remaining))?;
        let mut byte = [0u8];
        match stream.read(&mut byte) {
            Ok(0) if line.is_empty() => bail!("the other side closed the connection"),
            Ok(0) => bail!("a line cut short"),
            Ok(_) => line.push(byte[0]),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => return Err(timed_out()),
            Err(e) => return Err(e.into()),
        }
    }
    String::from_utf8(line).map_err(|_| anyhow!("a line that is not UTF-8"))
}

fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn from_hex(text: &str) -> Result<Vec<u8>> {
    if !text.len().is_multiple_of(2) || !text.bytes().all(|c| c.is_ascii_hexdigit()) {
        bail!("rendezvous: a malformed id from rank 0");
    }
    (0..text.len()).step_by(2).map(|i| Ok(u8::from_str_radix(&text[i..i + 2], 16)?)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hello_reads_back() {
        let hello = Hello { rank: 3, world_size: 4, version: "0.1.0".into(), flags: "abc123".into() };
        assert_eq!(Hello::parse(&hello.line()).unwrap(), hello);
        assert!(Hello::parse("GET / HTTP/1.1").is_err());
        assert!(Hello::parse("textnet-rendezvous 2 rank=1 world=2 version=x flags=y").is_err());
    }

    #[test]
    fn only_the_differing_fields_are_named() {
        let f = |a: &str, b: &str| differing_fields(a, b);
        assert_eq!(f("layers=6,lr=0.002,seed=1", "layers=6,lr=0.001,seed=1"), ("lr=0.002".into(), "lr=0.001".into()));
        assert_eq!(f("a=1,b=2", "a=1"), ("a=1,b=2".into(), "a=1".into()));
    }

    #[test]
    fn ids_round_trip_through_hex() {
        let id: Vec<u8> = (0..=255).collect();
        assert_eq!(from_hex(&to_hex(&id)).unwrap(), id);
        assert!(from_hex("abc").is_err());
        assert!(from_hex("zz").is_err());
    }
}
