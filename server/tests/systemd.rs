//! systemd integration without systemd: the real binary is started with `NOTIFY_SOCKET`
//! pointing at a datagram socket this test binds, as a service manager would. Also checks
//! the unit files in `deploy/systemd/` with `systemd-analyze verify` when it is installed.

mod support;

use std::io::{BufRead, BufReader};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use support::{request, signal, temp_dir, wait_timeout, URSULA_BIN};

struct Notified {
    child: Child,
    addr: mpsc::Receiver<String>,
    socket: UnixDatagram,
    _dir: tempfile::TempDir,
}

impl Drop for Notified {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Start `ursula` as systemd would start a `Type=notify` service.
fn start(env: &[(&str, &str)]) -> Notified {
    let dir = temp_dir("ursula-systemd");
    let sock_path = dir.path().join("notify.sock");
    let socket = UnixDatagram::bind(&sock_path).expect("bind notify socket");
    socket
        .set_read_timeout(Some(Duration::from_millis(100)))
        .expect("timeout");
    let data = dir.path().join("data");
    let mut cmd = Command::new(URSULA_BIN);
    cmd.args([
        "server",
        "--listen",
        "127.0.0.1:0",
        "--cores",
        "2",
        "--data-dir",
    ])
    .arg(&data)
    .env("NOTIFY_SOCKET", &sock_path)
    .env_remove("WATCHDOG_USEC")
    .env_remove("WATCHDOG_PID")
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("spawn ursula");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines();
        if let Some(Ok(line)) = lines.next() {
            let addr = line
                .strip_prefix(support::LISTENING_PREFIX)
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
        _dir: dir,
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
fn ready_is_sent_once_the_server_answers_and_stopping_on_sigterm() {
    let mut s = start(&[]);
    let ready = next_message(&s.socket, Duration::from_secs(60)).expect("READY=1 within 60 s");
    assert_eq!(lines(&ready), ["READY=1"], "first notification");
    // READY=1 promises that requests are served now: no retry, no grace period.
    let addr = s
        .addr
        .recv_timeout(Duration::from_secs(1))
        .expect("listening line printed before READY=1");
    let r = request(&addr, "GET", "/__ursula/readyz", &[], b"").expect("readyz");
    assert_eq!((r.status, r.body_str().as_str()), (200, "ready\n"));
    let r = request(
        &addr,
        "PUT",
        "/v1/stream/after-ready",
        &[("content-type", "text/plain")],
        b"x",
    )
    .expect("create");
    assert_eq!(r.status, 201);
    // No watchdog was asked for, so no keep-alives either.
    assert_eq!(next_message(&s.socket, Duration::from_millis(500)), None);

    signal(s.child.id() as i32, libc::SIGTERM);
    let stopping = next_message(&s.socket, Duration::from_secs(5)).expect("STOPPING=1");
    assert_eq!(lines(&stopping), ["STOPPING=1"]);
    let status = wait_timeout(&mut s.child, Duration::from_secs(20)).expect("exits");
    assert!(status.success(), "{status:?}");
}

#[test]
fn watchdog_keepalives_at_half_the_interval() {
    // 400 ms: keep-alives every 200 ms.
    let s = start(&[("WATCHDOG_USEC", "400000")]);
    let ready = next_message(&s.socket, Duration::from_secs(60)).expect("READY=1");
    assert_eq!(lines(&ready), ["READY=1"]);
    let started = Instant::now();
    let mut pings = 0;
    while started.elapsed() < Duration::from_millis(1500) {
        if let Some(m) = next_message(&s.socket, Duration::from_millis(100)) {
            assert_eq!(lines(&m), ["WATCHDOG=1"]);
            pings += 1;
        }
    }
    // About 7 expected; a loaded CI machine may be slower, but never silent.
    assert!((3..=12).contains(&pings), "{pings} keep-alives in 1.5 s");
}

#[test]
fn watchdog_for_another_pid_is_ignored() {
    // WATCHDOG_PID names the process that is meant to ping; it is not us.
    let s = start(&[("WATCHDOG_USEC", "200000"), ("WATCHDOG_PID", "1")]);
    let ready = next_message(&s.socket, Duration::from_secs(60)).expect("READY=1");
    assert_eq!(lines(&ready), ["READY=1"]);
    assert_eq!(next_message(&s.socket, Duration::from_millis(600)), None);
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

#[test]
fn unit_files_pass_systemd_analyze_verify() {
    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_err()
    {
        println!("skipped: systemd-analyze is not installed (Debian package systemd)");
        return;
    }
    let dir = temp_dir("ursula-units");
    let bin = Path::new(URSULA_BIN);
    let indexer = bin.with_file_name("ursula-indexer");
    for (unit, installed, built) in [
        (
            "ursula.service",
            "/usr/local/bin/ursula ",
            bin.to_path_buf(),
        ),
        (
            "ursula-indexer.service",
            "/usr/local/bin/ursula-indexer ",
            indexer,
        ),
    ] {
        let text = std::fs::read_to_string(repo_root().join("deploy/systemd").join(unit))
            .expect("read unit");
        assert!(text.contains(installed), "{unit} runs {installed}");
        // verify insists that ExecStart exists; point it at the binaries cargo built (the
        // indexer's when it has been built, otherwise any executable).
        let built = if built.exists() {
            built
        } else {
            PathBuf::from("/bin/true")
        };
        let local = text.replace(installed, &format!("{} ", built.display()));
        let path = dir.path().join(unit);
        std::fs::write(&path, local).expect("write unit");
        let out = Command::new("systemd-analyze")
            .arg("verify")
            .arg(&path)
            .output()
            .expect("run systemd-analyze");
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        // verify exits 0 on some problems (an unknown Type=, say) and only warns.
        assert!(
            out.status.success() && said.trim().is_empty(),
            "{unit}:\n{said}"
        );
    }
}
