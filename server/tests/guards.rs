//! Guards on how the server runs on its host. A second server must never share a running
//! server's data dir or port: both would silently split traffic (SO_REUSEPORT) or corrupt
//! the log. It restarts under load right after `kill -9`, keeps transparent huge pages off
//! for itself, and pins its cores inside the CPU mask it was started with.

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

/// Started inside a CPU mask (`taskset`, systemd's `CPUAffinity=`), the server pins its
/// cores to CPUs of that mask, not to CPU 0, 1, ... regardless.
#[test]
fn cores_pin_to_the_cpus_the_server_was_given() {
    let mine = cpus_allowed(&std::fs::read_to_string("/proc/thread-self/status").expect("status"));
    let given = *mine.last().expect("this thread may run somewhere");
    // The child inherits the mask of the thread that spawns it, so narrow this thread's
    // mask to the last CPU for the spawn, then widen it again.
    set_this_threads_cpus(&[given]);
    let dir = temp_dir("ursula-affinity");
    let server = Server::spawn_standard(&dir.path().join("data"), "disk", 1, &[], None);
    set_this_threads_cpus(&mine);

    let tasks = std::fs::read_dir(format!("/proc/{}/task", server.pid())).expect("tasks");
    let core_thread = tasks
        .flatten()
        .find(|t| {
            std::fs::read_to_string(t.path().join("comm"))
                .is_ok_and(|c| c.trim() == "ursula-core-0")
        })
        .expect("the server runs a thread named ursula-core-0");
    let status = std::fs::read_to_string(core_thread.path().join("status")).expect("status");
    assert_eq!(cpus_allowed(&status), vec![given], "core 0's CPUs");
}

/// `Cpus_allowed_list` of a /proc status file ("0-2,5") as CPU numbers.
fn cpus_allowed(status: &str) -> Vec<usize> {
    let list = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .expect("Cpus_allowed_list in /proc status")
        .trim();
    let mut cpus = Vec::new();
    for part in list.split(',') {
        let (from, to) = part.split_once('-').unwrap_or((part, part));
        let (from, to): (usize, usize) = (from.parse().expect("cpu"), to.parse().expect("cpu"));
        cpus.extend(from..=to);
    }
    cpus
}

fn set_this_threads_cpus(cpus: &[usize]) {
    // SAFETY: `cpu_set_t` is a plain bit array, valid when zeroed; CPU_SET is given CPUs
    // the kernel listed for this thread, all below CPU_SETSIZE, and sched_setaffinity reads
    // exactly the size it is given.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &cpu in cpus {
            libc::CPU_SET(cpu, &mut set);
        }
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    assert_eq!(rc, 0, "sched_setaffinity({cpus:?})");
}
