//! Runs every example in `docs/api.md`, so the document cannot drift from the server.
//!
//! Each ```sh block is run with bash, in document order, against a fresh `ursula` (with an
//! admin listener) and a fresh `ursula-indexer`, after replacing the documented addresses
//! (`localhost:4437`, `localhost:9437`, `localhost:4493`) with the real loopback ports.
//! A block states what it expects in comment lines:
//!
//! * `# expect: 201` one per response, in order: the status lines the block's `curl -i`
//!   commands print must be exactly these;
//! * `# expect-text: …` must appear in the block's output (headers and bodies).
//!
//! Blocks that only read (no `-X`, no `-d`) are retried for a few seconds until they match,
//! for the indexer, which catches up asynchronously.

mod support;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use support::{listen_addr, temp_dir, URSULA_BIN};

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Start `bin args`, and return it with the addresses from its first `lines` stdout lines
/// (`… listening on http://ADDR`).
fn spawn(bin: &Path, args: &[&str], lines: usize, log: &Path) -> (Proc, Vec<String>) {
    let stderr = std::fs::File::create(log).expect("log file");
    let mut child = Command::new(bin)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {}: {e}", bin.display()));
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            let _ = tx.send(line);
        }
    });
    let proc = Proc(child);
    let mut addrs = Vec::new();
    for _ in 0..lines {
        let line = rx
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("{} printed no listening line", bin.display()));
        let addr = line
            .split_once(" listening on http://")
            .map(|(_, a)| a.trim_end_matches('/').to_string())
            .unwrap_or_else(|| panic!("unexpected line {line:?}"));
        addrs.push(addr);
    }
    (proc, addrs)
}

struct Block {
    line: usize,
    script: String,
    statuses: Vec<u16>,
    texts: Vec<String>,
}

fn blocks(doc: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut current: Option<Block> = None;
    for (i, line) in doc.lines().enumerate() {
        match &mut current {
            None if line.trim_end() == "```sh" => {
                current = Some(Block {
                    line: i + 1,
                    script: String::new(),
                    statuses: Vec::new(),
                    texts: Vec::new(),
                })
            }
            None => {}
            Some(_) if line.trim_end() == "```" => out.extend(current.take()),
            Some(b) => {
                let t = line.trim();
                if let Some(s) = t.strip_prefix("# expect:") {
                    let code = s.split_whitespace().next().and_then(|c| c.parse().ok());
                    b.statuses.push(
                        code.unwrap_or_else(|| {
                            panic!("api.md:{}: bad expect line {line:?}", i + 1)
                        }),
                    );
                } else if let Some(s) = t.strip_prefix("# expect-text:") {
                    b.texts.push(s.trim().to_string());
                }
                b.script.push_str(line);
                b.script.push('\n');
            }
        }
    }
    assert!(current.is_none(), "api.md: unterminated ```sh block");
    out
}

/// The status codes of every response head in `output`, skipping interim `100`s.
fn statuses(output: &str) -> Vec<u16> {
    output
        .lines()
        .filter(|l| l.starts_with("HTTP/1.1 "))
        .filter_map(|l| l.split_whitespace().nth(1)?.parse().ok())
        .filter(|&c| c != 100)
        .collect()
}

fn run(script: &str, dir: &Path) -> String {
    // curl gets a default time limit (a --max-time in the block comes later and wins), and
    // a line break after its output, so the next status line starts a line.
    let prelude =
        "curl() { command curl -sS --max-time 10 \"$@\"; local rc=$?; echo; return $rc; }\n";
    let out = Command::new("bash")
        .arg("-c")
        .arg(format!("{prelude}{script}"))
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .expect("run bash");
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

#[test]
fn every_api_doc_example_runs_as_documented() {
    let doc = std::fs::read_to_string(repo_root().join("docs/api.md")).expect("read api.md");
    let blocks = blocks(&doc);
    assert!(blocks.len() >= 40, "only {} examples found", blocks.len());

    let dir = temp_dir("ursula-api-doc");
    let indexer_bin = Path::new(URSULA_BIN).with_file_name("ursula-indexer");
    assert!(
        indexer_bin.exists(),
        "{} not found: build it first (cargo build -p ursula-indexer)",
        indexer_bin.display()
    );
    let data = dir.path().join("data");
    let (listen, metrics_listen) = (listen_addr(), listen_addr());
    let (_server, addrs) = spawn(
        Path::new(URSULA_BIN),
        &[
            "server",
            "--listen",
            &listen,
            "--metrics-listen",
            &metrics_listen,
            "--storage",
            "memory",
            "--cores",
            "2",
            "--long-poll-timeout-ms",
            "500",
            "--data-dir",
            data.to_str().expect("utf-8"),
        ],
        2,
        &dir.path().join("server.log"),
    );
    let store = dir.path().join("index");
    let indexer_listen = listen_addr();
    let (_indexer, ix) = spawn(
        &indexer_bin,
        &[
            "--listen",
            &indexer_listen,
            "--store-dir",
            store.to_str().expect("utf-8"),
            "--commit-interval-ms",
            "200",
            "--poll-interval-ms",
            "100",
        ],
        1,
        &dir.path().join("indexer.log"),
    );
    let work = dir.path().join("work");
    std::fs::create_dir(&work).expect("mkdir");

    for b in &blocks {
        assert!(
            !b.statuses.is_empty(),
            "api.md:{}: every example states the statuses it expects",
            b.line
        );
        let script = b
            .script
            .replace("localhost:4437", &addrs[0])
            .replace("localhost:9437", &addrs[1])
            .replace("localhost:4493", &ix[0]);
        let read_only =
            !script.contains(" -X ") && !script.contains(" -d") && !script.contains("--data");
        let deadline = Instant::now() + Duration::from_secs(if read_only { 15 } else { 0 });
        loop {
            let output = run(&script, &work);
            let got = statuses(&output);
            let missing: Vec<&String> = b
                .texts
                .iter()
                .filter(|t| !output.contains(t.as_str()))
                .collect();
            if got == b.statuses && missing.is_empty() {
                break;
            }
            if Instant::now() >= deadline {
                panic!(
                    "api.md:{}: expected statuses {:?}, got {got:?}; missing text {missing:?}\n--- script ---\n{script}--- output ---\n{output}",
                    b.line, b.statuses
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}
