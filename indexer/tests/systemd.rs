//! systemd integration of `ursula-indexer` without systemd: the real binary runs with
//! `NOTIFY_SOCKET` pointing at a datagram socket this test binds, as a service manager
//! would for `Type=notify`.

mod support;

use std::io::{BufRead, BufReader};
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use sonic_rs::JsonValueTrait;
use support::*;

struct Notified {
    child: Child,
    addr: mpsc::Receiver<String>,
    socket: UnixDatagram,
}

impl Drop for Notified {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn start(dir: &Path, store: &Path, env: &[(&str, &str)]) -> Notified {
    let sock_path = dir.join("notify.sock");
    let _ = std::fs::remove_file(&sock_path);
    let socket = UnixDatagram::bind(&sock_path).expect("bind notify socket");
    socket
        .set_read_timeout(Some(Duration::from_millis(100)))
        .expect("timeout");
    let mut cmd = Command::new(INDEXER_BIN);
    cmd.args(fast_flags())
        .arg("--store-dir")
        .arg(store)
        .env("NOTIFY_SOCKET", &sock_path)
        .env_remove("WATCHDOG_USEC")
        .env_remove("WATCHDOG_PID")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("spawn ursula-indexer");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines();
        if let Some(Ok(line)) = lines.next() {
            let addr = line
                .strip_prefix("ursula-indexer listening on http://")
                .unwrap_or_default()
                .to_string();
            let _ = tx.send(addr);
        }
        for _ in lines {}
    });
    Notified {
        child,
        addr: rx,
        socket,
    }
}

/// The next notification, or `None` when none arrives within `wait`.
fn next_message(socket: &UnixDatagram, wait: Duration) -> Option<String> {
    let deadline = Instant::now() + wait;
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        match socket.recv(&mut buf) {
            Ok(n) => return Some(String::from_utf8_lossy(&buf[..n]).into_owned()),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(e) => panic!("recv: {e}"),
        }
    }
    None
}

fn lines(msg: &str) -> Vec<&str> {
    msg.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect()
}

#[test]
fn ready_after_the_catalog_is_loaded_and_stopping_on_sigterm() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("store");
    let u = ursula(dir.path());
    expect(&u.addr, "PUT", "/sdnotify", &[], b"", 201);
    expect(&u.addr, "PUT", "/sdnotify/events", &[JSON], b"", 201);
    expect(
        &u.addr,
        "POST",
        "/sdnotify/events",
        &[JSON],
        br#"[{"captured_at":1784370600000}]"#,
        204,
    );

    // A first run registers an index, so the next start has manifest state to load.
    let mut first = start(dir.path(), &store, &[]);
    let ready = next_message(&first.socket, Duration::from_secs(30)).expect("READY=1");
    assert_eq!(lines(&ready), ["READY=1"]);
    let addr = first
        .addr
        .recv_timeout(Duration::from_secs(1))
        .expect("addr");
    let stream_url = format!("{}/sdnotify/events", u.url());
    assert_eq!(register(&addr, "sd", &stream_url, "").status, 201);
    wait_durable(&addr, "sd", &u.addr, "/sdnotify/events");
    let durable = status(&addr, "sd")["coverage"]["durable"]
        .as_str()
        .map(str::to_string);
    assert!(durable.is_some());
    signal_term(&first.child);
    let stopping = next_message(&first.socket, Duration::from_secs(5)).expect("STOPPING=1");
    assert_eq!(lines(&stopping), ["STOPPING=1"]);
    let st = wait_exit(&mut first.child, Duration::from_secs(10)).expect("exits");
    assert!(st.success(), "{st:?}");
    drop(first);

    // The second start: READY=1 promises the listener answers and the index is open, with
    // no retry or grace period.
    let second = start(dir.path(), &store, &[]);
    let ready = next_message(&second.socket, Duration::from_secs(30)).expect("READY=1");
    assert_eq!(lines(&ready), ["READY=1"]);
    let addr = second
        .addr
        .recv_timeout(Duration::from_secs(1))
        .expect("listening line printed before READY=1");
    let r = request(&addr, "GET", "/readyz", &[], b"");
    assert_eq!(r.status, 204, "{}", r.text());
    let s = status(&addr, "sd");
    // Its manifest was loaded before READY=1: durable coverage is what the first run left.
    assert_eq!(
        s["coverage"]["durable"].as_str().map(str::to_string),
        durable,
        "{s:?}"
    );
    // No watchdog was asked for, so no keep-alives.
    assert_eq!(
        next_message(&second.socket, Duration::from_millis(500)),
        None
    );
}

#[test]
fn watchdog_keepalives_at_half_the_interval() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("store");
    // 400 ms: keep-alives every 200 ms.
    let s = start(dir.path(), &store, &[("WATCHDOG_USEC", "400000")]);
    let started = Instant::now();
    let (mut ready, mut pings) = (0, 0);
    while started.elapsed() < Duration::from_millis(1500) {
        if let Some(m) = next_message(&s.socket, Duration::from_millis(100)) {
            for l in lines(&m) {
                match l {
                    "READY=1" => ready += 1,
                    "WATCHDOG=1" => pings += 1,
                    other => panic!("unexpected notification {other:?}"),
                }
            }
        }
    }
    assert_eq!(ready, 1);
    // About 8 expected; a loaded CI machine may be slower, but never silent.
    assert!((3..=12).contains(&pings), "{pings} keep-alives in 1.5 s");
}

#[test]
fn watchdog_for_another_pid_is_ignored() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("store");
    let s = start(
        dir.path(),
        &store,
        &[("WATCHDOG_USEC", "200000"), ("WATCHDOG_PID", "1")],
    );
    let ready = next_message(&s.socket, Duration::from_secs(30)).expect("READY=1");
    assert_eq!(lines(&ready), ["READY=1"]);
    assert_eq!(next_message(&s.socket, Duration::from_millis(600)), None);
}

fn signal_term(child: &Child) {
    let st = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("run kill");
    assert!(st.success(), "kill -TERM");
}

fn wait_exit(child: &mut Child, timeout: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if let Ok(Some(st)) = child.try_wait() {
            return Some(st);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}
