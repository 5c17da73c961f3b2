//! A second server must never share a running server's data dir or port: both would
//! silently split traffic (SO_REUSEPORT) or corrupt the log.

mod support;

use std::process::Command;
use std::time::Duration;

use support::{temp_dir, Server};

fn second(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ursula"))
        .args(args)
        .output()
        .expect("run ursula");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn data_dir_and_port_are_exclusive() {
    let dir = temp_dir("ursula-guards");
    let data = dir.path().join("data");
    let first = Server::spawn_standard(&data, "disk", 2, &[], None);
    let data_arg = data.to_str().expect("utf-8");
    let (ok, err) = second(&[
        "server",
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        data_arg,
        "--cores",
        "2",
    ]);
    assert!(!ok, "a second server started on the same data dir");
    assert!(err.contains("in use by another ursula process"), "{err}");
    let other = dir.path().join("other");
    let (ok, err) = second(&[
        "server",
        "--listen",
        &first.addr,
        "--data-dir",
        other.to_str().expect("utf-8"),
        "--cores",
        "2",
    ]);
    assert!(!ok, "a second server joined the first one's port");
    assert!(err.contains("Address already in use"), "{err}");
    // Once the first is gone (even by kill -9) the data dir can be used again.
    first.kill9();
    let again = Server::spawn_standard(&data, "disk", 2, &[], None);
    again.sigterm(Duration::from_secs(10)).expect("exits");
}

/// A supervisor restarts a crashed server at once. After a `kill -9` under load the dead
/// process's listening socket lingers while the kernel tears down its io_uring; the new
/// server must come up on the same port anyway and serve everything that was acknowledged.
#[test]
fn a_restart_right_after_kill9_under_load_comes_up_and_serves() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    const BODY: &[u8] = &[b'x'; 512];
    let dir = temp_dir("ursula-rebind");
    let data = dir.path().join("data");
    let log = dir.path().join("server.log");
    let first = Server::spawn_standard(&data, "disk", 2, &[], Some(&log));
    let addr = first.addr.clone();
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..8)
        .map(|i| {
            let (addr, stop) = (addr.clone(), stop.clone());
            std::thread::spawn(move || {
                let path = format!("/v1/stream/rebind-{i}");
                let mut c = support::Client::new(&addr);
                let ct = [("Content-Type", "application/octet-stream")];
                let r = c.request("PUT", &path, &ct, b"").expect("create");
                assert!(r.is_success(), "create {path}: {}", r.status);
                let mut acked = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    match c.request("POST", &path, &ct, BODY) {
                        Ok(r) if r.is_success() => acked += 1,
                        _ => break,
                    }
                }
                (path, acked)
            })
        })
        .collect();
    // Long-polls keep reads in flight on the rings too.
    let pollers: Vec<_> = (0..4)
        .map(|i| {
            let addr = addr.clone();
            std::thread::spawn(move || {
                let mut c = support::Client::new(&addr);
                let path = format!("/v1/stream/rebind-{i}?offset=now&live=long-poll");
                while c.request("GET", &path, &[], b"").is_ok() {}
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(1500));
    first.kill9();
    let data_arg = data.to_str().expect("utf-8");
    let again = Server::spawn(
        &[
            "server",
            "--listen",
            &addr,
            "--data-dir",
            data_arg,
            "--cores",
            "2",
        ],
        Some(&log),
        Duration::from_secs(60),
    );
    stop.store(true, Ordering::Relaxed);
    let acked: Vec<(String, u64)> = writers
        .into_iter()
        .map(|w| w.join().expect("writer"))
        .collect();
    for p in pollers {
        p.join().expect("poller");
    }
    assert!(
        acked.iter().all(|(_, n)| *n > 0),
        "no load before the kill: {acked:?}"
    );
    let mut c = again.client();
    for (path, n) in &acked {
        let r = c
            .request("GET", &format!("{path}?offset=-1"), &[], b"")
            .expect("read after restart");
        assert_eq!(r.status, 200, "{path}");
        // Every acknowledged append is there (one more may have landed unacknowledged).
        let want = *n as usize * BODY.len();
        assert!(
            r.body.len() >= want,
            "{path}: {} bytes, acknowledged {want}",
            r.body.len()
        );
        assert!(r.body.iter().all(|b| *b == b'x'), "{path}: foreign bytes");
        let r = c
            .request(
                "POST",
                path,
                &[("Content-Type", "application/octet-stream")],
                BODY,
            )
            .expect("append after restart");
        assert!(
            r.is_success(),
            "append to {path} after the restart: {}",
            r.status
        );
    }
    again.sigterm(Duration::from_secs(10)).expect("exits");
}

/// The server keeps transparent huge pages off for itself (RSS follows the live heap, not
/// how it lies in 2 MiB ranges; see `refuse_transparent_huge_pages`), whatever the host's
/// setting.
#[test]
fn the_server_runs_without_transparent_huge_pages() {
    let dir = temp_dir("ursula-thp");
    let server = Server::spawn_standard(&dir.path().join("data"), "disk", 1, &[], None);
    let status = std::fs::read_to_string(format!("/proc/{}/status", server.pid()))
        .expect("read the server's /proc status");
    let thp = status
        .lines()
        .find_map(|l| l.strip_prefix("THP_enabled:"))
        .map(str::trim);
    assert_eq!(thp, Some("0"), "THP_enabled in /proc/PID/status");
}
