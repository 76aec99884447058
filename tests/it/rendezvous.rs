//! The rendezvous of a run over several processes (`textnet::device::rendezvous`), over loopback with one thread a
//! rank: the ranks that agree all get rank 0's id; a rank that disagrees, a rank that never comes, a
//! rank claimed twice and a port in use each end every rank with one line naming the cause.

use std::net::TcpListener;
use std::thread;
use std::time::{Duration, Instant};
use textnet::device::rendezvous::Rendezvous;

const VERSION: &str = "0.1.0";
const FLAGS: &str = "layers6-embed384-lr0.001";

/// A port that was free a moment ago.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Runs ranks (rank, world size, version, flags) at `port`, each in a thread, with `timeout`; returns each
/// rank's id or error line in the order given.
fn run(port: u16, ranks: &[(usize, usize, &str, &str)], timeout: Duration) -> Vec<Result<Vec<u8>, String>> {
    let threads: Vec<_> = ranks
        .iter()
        .map(|&(rank, world, version, flags)| {
            let (version, flags) = (version.to_string(), flags.to_string());
            thread::spawn(move || {
                let r = Rendezvous::new(world, rank, &format!("127.0.0.1:{port}"), timeout)
                    .map_err(|e| format!("{e:#}"))?;
                r.meet(&version, &flags, || Ok(vec![7, 0, 255, 42])).map(|m| m.id).map_err(|e| format!("{e:#}"))
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

#[test]
fn every_rank_gets_rank_0s_id() {
    // Rank 0 last: the others retry until it listens.
    let ranks = [(2, 3, VERSION, FLAGS), (1, 3, VERSION, FLAGS), (0, 3, VERSION, FLAGS)];
    for got in run(free_port(), &ranks, Duration::from_secs(20)) {
        assert_eq!(got.unwrap(), vec![7, 0, 255, 42]);
    }
}

#[test]
fn a_world_of_one_needs_no_other_rank() {
    let got = run(free_port(), &[(0, 1, VERSION, FLAGS)], Duration::from_secs(5));
    assert_eq!(got[0].clone().unwrap(), vec![7, 0, 255, 42]);
}

#[test]
fn other_flags_end_every_rank_with_the_reason() {
    let ranks = [(0, 3, VERSION, FLAGS), (1, 3, VERSION, FLAGS), (2, 3, VERSION, "layers6-embed256-lr0.001")];
    let got = run(free_port(), &ranks, Duration::from_secs(20));
    // Rank 1 may arrive before or after rank 2: either way the run cannot start.
    for (i, g) in got.iter().enumerate() {
        let e = g.clone().expect_err(&format!("rank {i} went on"));
        assert!(e.contains("rank 2 was started with other training flags than rank 0"), "{e}");
        assert!(!e.contains('\n'), "{e}");
    }
}

#[test]
fn another_version_ends_every_rank_with_the_reason() {
    let got = run(free_port(), &[(0, 2, VERSION, FLAGS), (1, 2, "0.2.0", FLAGS)], Duration::from_secs(20));
    for g in got {
        let e = g.unwrap_err();
        assert!(e.contains("rank 1 runs textnet 0.2.0, rank 0 textnet 0.1.0"), "{e}");
    }
}

#[test]
fn a_rank_claimed_twice_or_another_world_size_is_refused() {
    let got = run(
        free_port(),
        &[(0, 3, VERSION, FLAGS), (1, 3, VERSION, FLAGS), (1, 3, VERSION, FLAGS)],
        Duration::from_secs(20),
    );
    assert!(got.iter().all(|g| g.as_ref().is_err_and(|e| e.contains("two processes joined as rank 1"))), "{got:?}");
    let got = run(free_port(), &[(0, 2, VERSION, FLAGS), (1, 3, VERSION, FLAGS)], Duration::from_secs(20));
    assert!(
        got.iter()
            .all(|g| g.as_ref().is_err_and(|e| e.contains("rank 1 was started with --world-size 3, rank 0 with 2"))),
        "{got:?}"
    );
}

#[test]
fn a_rank_that_never_comes_ends_the_others_within_the_timeout() {
    let timeout = Duration::from_secs(2);
    let start = Instant::now();
    let got = run(free_port(), &[(0, 3, VERSION, FLAGS), (1, 3, VERSION, FLAGS)], timeout);
    assert!(start.elapsed() < timeout + Duration::from_secs(3), "{:?}", start.elapsed());
    for g in got {
        let e = g.unwrap_err();
        assert!(e.contains("rank 2 did not arrive within 2 s"), "{e}");
    }
    // Without rank 0 a rank gives up at its timeout too.
    let start = Instant::now();
    let got = run(free_port(), &[(1, 2, VERSION, FLAGS)], timeout);
    assert!(start.elapsed() < timeout + Duration::from_secs(3));
    let e = got[0].clone().unwrap_err();
    assert!(e.contains("rank 0 at 127.0.0.1:") && e.contains("did not answer within 2 s"), "{e}");
}

#[test]
fn a_port_in_use_is_named() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let got = run(port, &[(0, 2, VERSION, FLAGS)], Duration::from_secs(2));
    let e = got[0].clone().unwrap_err();
    assert_eq!(e, format!("--rendezvous 127.0.0.1:{port}: the port is in use (rank 0 listens there)"));
}

#[test]
fn a_stranger_on_the_port_gets_an_answer_and_the_run_goes_on() {
    use std::io::{BufRead, BufReader, Write};
    let port = free_port();
    let rank0 = thread::spawn(move || run(port, &[(0, 2, VERSION, FLAGS)], Duration::from_secs(20)));
    // Rank 1 has not started: rank 0 answers the stranger and keeps waiting.
    let deadline = Instant::now() + Duration::from_secs(10);
    let answer = loop {
        if let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) {
            s.write_all(b"GET / HTTP/1.1\n").unwrap();
            let mut line = String::new();
            BufReader::new(&s).read_line(&mut line).unwrap();
            break line;
        }
        assert!(Instant::now() < deadline, "rank 0 never listened");
        thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(answer, "error not a textnet rendezvous\n");
    let rank1 = run(port, &[(1, 2, VERSION, FLAGS)], Duration::from_secs(20));
    for g in rank0.join().unwrap().into_iter().chain(rank1) {
        assert_eq!(g.unwrap(), vec![7, 0, 255, 42]);
    }
}

/// DP24: a client that connects first and never says a word (a port check, a stray `nc`) held rank 0 for
/// its whole timeout. It is dropped after a few seconds, and the ranks meet. Both ranks wait up to 10
/// minutes, so that the guard, far below that and far above the few seconds, sees a rank 0 held.
#[test]
fn dp24_a_silent_client_does_not_hold_rank_0() {
    use std::io::{BufRead, BufReader};
    let (port, timeout, guard) = (free_port(), Duration::from_secs(600), Duration::from_secs(120));
    let (done, results) = std::sync::mpsc::channel();
    let rank = |rank: usize| {
        let done = done.clone();
        thread::spawn(move || done.send(run(port, &[(rank, 2, VERSION, FLAGS)], timeout)).unwrap())
    };
    rank(0);
    let deadline = Instant::now() + guard;
    let silent = loop {
        if let Ok(s) = std::net::TcpStream::connect(("127.0.0.1", port)) {
            break s;
        }
        assert!(Instant::now() < deadline, "rank 0 never listened");
        thread::sleep(Duration::from_millis(20));
    };
    rank(1);
    for _ in 0..2 {
        let got = results.recv_timeout(guard).expect("a silent client held the rendezvous");
        assert_eq!(got[0].clone().unwrap(), vec![7, 0, 255, 42]);
    }
    let mut answer = String::new();
    BufReader::new(&silent).read_line(&mut answer).unwrap();
    assert!(answer.starts_with("error no answer within"), "{answer}");
}

/// DP20, DP22: a rank says whom it waits for as it starts to wait, rather than nothing for minutes.
#[test]
fn dp20_dp22_a_waiting_rank_says_whom_it_waits_for() {
    let waiting = |world: usize, rank: usize| {
        Rendezvous::new(world, rank, "node0:29500", Duration::from_secs(300)).unwrap().waiting()
    };
    assert_eq!(waiting(2, 1).unwrap(), "rank 1: waiting up to 300 s for rank 0 at node0:29500");
    assert_eq!(waiting(4, 3).unwrap(), "rank 3: waiting up to 300 s for rank 0 at node0:29500");
    assert_eq!(waiting(2, 0).unwrap(), "rank 0: waiting up to 300 s for rank 1 at node0:29500");
    assert_eq!(waiting(4, 0).unwrap(), "rank 0: waiting up to 300 s for ranks 1…3 at node0:29500");
    assert_eq!(waiting(1, 0), None);
}

#[test]
fn flag_values_are_checked_before_any_network() {
    let t = Duration::from_secs(1);
    let e = |r: anyhow::Result<Rendezvous>| format!("{:#}", r.unwrap_err());
    assert_eq!(e(Rendezvous::new(0, 0, "h:1", t)), "--world-size must be at least 1");
    assert_eq!(e(Rendezvous::new(2, 2, "h:1", t)), "--rank 2 is not below --world-size 2");
    assert_eq!(e(Rendezvous::new(2, 0, "nohost", t)), "--rendezvous nohost: expected HOST:PORT");
    for bad in [":29500", "h:0", "h:70000", "h:port"] {
        assert_eq!(
            e(Rendezvous::new(2, 0, bad, t)),
            format!("--rendezvous {bad}: expected HOST:PORT with a port from 1 to 65535")
        );
    }
}

/// What each watch test's rank 0 was told of rank 1 (the watcher thread that was told then waits forever,
/// as the process would have ended there).
static GONE_KILLED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
static GONE_FINISHED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

fn told(lines: &std::sync::Mutex<Vec<String>>, line: &str) -> ! {
    lines.lock().unwrap().push(line.to_string());
    loop {
        thread::park();
    }
}

/// Two ranks meet and watch each other (rank 0 with `gone`); `end1` then ends rank 1, and rank 0 runs on
/// for `wait`.
fn rank_1_ends(gone: fn(&str) -> !, end1: impl FnOnce(textnet::device::rendezvous::Watch), wait: Duration) {
    let address = format!("127.0.0.1:{}", free_port());
    let a = address.clone();
    let rank0 = thread::spawn(move || {
        Rendezvous::new(2, 0, &a, Duration::from_secs(20)).unwrap().meet(VERSION, FLAGS, || Ok(vec![1])).unwrap()
    });
    let rank1 =
        Rendezvous::new(2, 1, &address, Duration::from_secs(20)).unwrap().meet(VERSION, FLAGS, || unreachable!());
    let watch0 = rank0.join().unwrap().watch(0, gone);
    end1(rank1.unwrap().watch(1, |_| {
        loop {
            thread::park();
        }
    }));
    thread::sleep(wait);
    watch0.finish();
}

#[test]
fn a_rank_that_stops_without_finishing_stops_the_one_it_is_linked_to() {
    // Dropping the watch's links closes them as a killed process's would.
    rank_1_ends(|l| told(&GONE_KILLED, l), drop, Duration::from_millis(500));
    assert_eq!(
        *GONE_KILLED.lock().unwrap(),
        ["rank 1 ended without finishing (its process stopped); rank 0 stops too"]
    );
}

#[test]
fn a_rank_that_finishes_stops_nobody() {
    rank_1_ends(|l| told(&GONE_FINISHED, l), |watch| watch.finish(), Duration::from_millis(500));
    assert!(GONE_FINISHED.lock().unwrap().is_empty());
}
