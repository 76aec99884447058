//! Helpers of the bad-input regression tests (`tests/bad_input_*.rs`): each test runs the binary on
//! one case of the bad-input audit of 2026-11-24 (its ID in the test's name) and checks what a user
//! should see. `TEXTNET_TEST_BIN` runs them against another build, e.g. the audited commit, on which
//! each of them fails.
#![allow(dead_code)]

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The binary under test.
pub fn bin() -> PathBuf {
    std::env::var_os("TEXTNET_TEST_BIN").map_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_textnet")), PathBuf::from)
}

/// A command of the binary under test, run in `dir`, with no GPU asked for by the environment.
pub fn textnet<S: AsRef<OsStr>>(dir: &Path, args: &[S]) -> Command {
    let mut command = Command::new(bin());
    command.args(args).current_dir(dir).stdin(Stdio::null()).env_remove("RUST_BACKTRACE");
    command
}

/// What a run did: exit status (None: killed by a signal or by the time limit), output, whether it
/// was stopped for running too long.
pub struct Run {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub timed_out: bool,
}

impl Run {
    /// The one-line error a failing command should print, checked: exit status 1 (or `code`), one line
    /// on stderr starting "textnet: error: " and containing each of `expected`.
    pub fn fails_with(&self, expected: &[&str]) -> &Run {
        self.fails_with_code(1, expected)
    }

    pub fn fails_with_code(&self, code: i32, expected: &[&str]) -> &Run {
        assert!(!self.timed_out, "hung: {}", self.stderr);
        assert_eq!(self.code, Some(code), "exit status; stderr: {}", self.stderr);
        let errors: Vec<&str> = self.stderr.lines().filter(|l| l.starts_with("textnet: error: ")).collect();
        assert_eq!(errors.len(), 1, "one error line expected: {}", self.stderr);
        assert!(!self.stderr.contains("internal error") && !self.stderr.contains("panicked"), "{}", self.stderr);
        for e in expected {
            assert!(errors[0].contains(e), "{:?} lacks {e:?}", errors[0]);
        }
        self
    }

    pub fn succeeds(&self) -> &Run {
        assert!(!self.timed_out, "hung: {}", self.stderr);
        assert_eq!(self.code, Some(0), "exit status; stderr: {}", self.stderr);
        self
    }
}

/// Runs `command` to its end or for at most `limit`, feeding `stdin` when given.
pub fn run_for(mut command: Command, limit: Duration) -> Run {
    command.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = command.spawn().expect("cannot start textnet");
    let (out, err) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let read = |mut r: Box<dyn std::io::Read + Send>| {
        std::thread::spawn(move || {
            let mut s = Vec::new();
            let _ = r.read_to_end(&mut s);
            String::from_utf8_lossy(&s).into_owned()
        })
    };
    let (out, err) = (read(Box::new(out)), read(Box::new(err)));
    let start = Instant::now();
    let mut timed_out = false;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if start.elapsed() > limit {
            timed_out = true;
            let _ = child.kill();
            break child.wait().expect("wait");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Run { code: status.code(), stdout: out.join().unwrap(), stderr: err.join().unwrap(), timed_out }
}

/// Runs `args` in `dir` for at most a minute.
pub fn run<S: AsRef<OsStr>>(dir: &Path, args: &[S]) -> Run {
    run_for(textnet(dir, args), Duration::from_secs(60))
}

/// Runs `args` in `dir` under an address-space limit of `bytes` (`ulimit -v`).
pub fn run_limited<S: AsRef<OsStr>>(dir: &Path, args: &[S], bytes: u64) -> Run {
    let mut command = textnet(dir, args);
    // SAFETY: setrlimit is async-signal-safe and touches no memory of the parent.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut command, move || {
            let limit = libc::rlimit { rlim_cur: bytes, rlim_max: bytes };
            if libc::setrlimit(libc::RLIMIT_AS, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    run_for(command, Duration::from_secs(60))
}

/// The bytes of `path`.
pub fn bytes(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// An English-like corpus of `words` words from a small Markov chain over 40 words, so that a model
/// learns something from it in one short epoch.
pub fn english(words: usize, seed: u64) -> String {
    const WORDS: [&str; 40] = [
        "the", "king", "queen", "lord", "lady", "my", "thy", "thou", "art", "love", "death", "night", "day", "sword",
        "crown", "blood", "heart", "and", "of", "to", "in", "is", "not", "be", "that", "with", "his", "her", "me",
        "you", "what", "shall", "will", "good", "come", "go", "speak", ".", ",", ";",
    ];
    let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let mut next = move || {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (state >> 33) as usize
    };
    let mut word = 0;
    let mut text = Vec::with_capacity(words);
    for _ in 0..words {
        text.push(WORDS[word]);
        word = if next() % 10 < 9 { (word * 7 + 1 + next() % 5) % WORDS.len() } else { next() % WORDS.len() };
    }
    text.join(" ")
}

/// Whether this process may mount file systems and set immutable flags (root), for the disk-full cases.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// `model`, a safetensors file, written to `out` with its metadata changed by `change` (tensors as they
/// were): the crafted files of the loader cases.
pub fn with_metadata(model: &Path, out: &Path, change: impl FnOnce(&mut serde_json::Map<String, serde_json::Value>)) {
    with_header(model, out, |header| change(header["__metadata__"].as_object_mut().unwrap()));
}

/// `model`, a safetensors file, written to `out` with its JSON header changed by `change` (the tensors'
/// bytes as they were, whatever the header now says of them).
pub fn with_header(model: &Path, out: &Path, change: impl FnOnce(&mut serde_json::Value)) {
    let file = bytes(model);
    let n = u64::from_le_bytes(file[..8].try_into().unwrap()) as usize;
    let mut header: serde_json::Value = serde_json::from_slice(&file[8..8 + n]).unwrap();
    change(&mut header);
    let mut text = serde_json::to_vec(&header).unwrap();
    text.resize(text.len().next_multiple_of(8), b' ');
    let mut rewritten = (text.len() as u64).to_le_bytes().to_vec();
    rewritten.extend(text);
    rewritten.extend(&file[8 + n..]);
    std::fs::write(out, rewritten).unwrap();
}

/// `mount -t tmpfs` of `size` at `dir`/full, unmounted on drop; None where this process may not mount.
pub struct Tmpfs(PathBuf);

impl Tmpfs {
    pub fn mount(dir: &Path, size: &str) -> Option<Tmpfs> {
        let path = dir.join("full");
        std::fs::create_dir(&path).unwrap();
        let ok = is_root()
            && std::process::Command::new("mount")
                .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
                .arg(&path)
                .status()
                .is_ok_and(|s| s.success());
        ok.then_some(Tmpfs(path))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}
