//! Disk faults against the real binary: a failed durable log write (injected) and a full
//! filesystem (a loop-mounted ext4 image, which needs root: CI runs as root).
//!
//! In both cases nothing unacknowledged is reported as written, nothing acknowledged is
//! lost, and reads keep working.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use support::{temp_dir, Server};

const TEXT: (&str, &str) = ("Content-Type", "text/plain");

fn server_args(data_dir: &Path, config: Option<&str>) -> Vec<String> {
    let mut args: Vec<String> = [
        "server",
        "--listen",
        "127.0.0.1:0",
        "--storage",
        "disk",
        "--cores",
        "1",
        "--long-poll-timeout-ms",
        "500",
        "--data-dir",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.push(data_dir.to_str().expect("utf-8 path").to_string());
    if let Some(c) = config {
        args.push("--config".into());
        args.push(c.into());
    }
    args
}

fn spawn(data_dir: &Path, config: Option<&str>, env: &[(&str, &str)], log: &Path) -> Server {
    let args = server_args(data_dir, config);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Server::spawn_with_env(&args, env, Some(log), Duration::from_secs(60))
}

fn read_all(server: &Server, path: &str) -> Vec<u8> {
    let mut c = server.client();
    let mut out = Vec::new();
    let mut offset = "-1".to_string();
    loop {
        let r = c
            .request("GET", &format!("{path}?offset={offset}"), &[], b"")
            .expect("GET");
        assert_eq!(r.status, 200, "GET {path}: {}", r.body_str());
        out.extend_from_slice(&r.body);
        let next = r
            .header("stream-next-offset")
            .expect("next offset")
            .to_string();
        if r.header("stream-up-to-date").is_some() || next == offset {
            return out;
        }
        offset = next;
    }
}

#[test]
fn a_failed_commit_write_acknowledges_nothing_and_refuses_further_writes() {
    let dir = temp_dir("ursula-commit-fault-");
    let data = dir.path().join("data");
    let log = dir.path().join("server.log");
    let server = spawn(
        &data,
        None,
        &[("URSULA_FAULT_FAIL_COMMIT_AFTER", "6")],
        &log,
    );
    let mut c = server.client();
    let r = c.request("PUT", "/v1/stream/f", &[TEXT], b"").expect("PUT");
    assert_eq!(r.status, 201);
    let mut acked = Vec::new();
    let mut failed = None;
    for i in 0..20 {
        let body = format!("append-{i};");
        let r = c
            .request("POST", "/v1/stream/f", &[TEXT], body.as_bytes())
            .expect("POST");
        if r.is_success() {
            acked.extend_from_slice(body.as_bytes());
        } else {
            failed = Some((r.status, body));
            break;
        }
    }
    let (status, lost) = failed.expect("the injected commit failure refused an append");
    // A failed durable write is permanent for this process: 500, never "retry".
    assert_eq!(status, 500, "a failed flush is a storage fault");
    assert!(!acked.is_empty());
    // The shard no longer trusts its log: every later write is refused, reads still work
    // and show exactly what was acknowledged.
    for path in ["/v1/stream/f", "/v1/stream/other"] {
        let method = if path.ends_with('f') { "POST" } else { "PUT" };
        let r = c.request(method, path, &[TEXT], b"more").expect("write");
        assert_eq!(r.status, 500, "{method} {path} after the failure");
        assert!(
            r.header("retry-after").is_none(),
            "a permanent fault is no retry"
        );
        assert_eq!(
            r.body_str(),
            "storage_fault: storage failed; writes are refused until the server restarts\n"
        );
    }
    assert_eq!(read_all(&server, "/v1/stream/f"), acked);
    server.kill9();

    // After a restart (no fault), everything acknowledged is there; the append whose flush
    // failed is there whole or not at all; writing works again.
    let server = spawn(&data, None, &[], &log);
    let got = read_all(&server, "/v1/stream/f");
    let mut with_lost = acked.clone();
    with_lost.extend_from_slice(lost.as_bytes());
    assert!(got == acked || got == with_lost, "after restart: {got:?}");
    let mut c = server.client();
    let r = c
        .request("POST", "/v1/stream/f", &[TEXT], b"again;")
        .expect("POST");
    assert!(r.is_success(), "{}", r.status);
    server.kill9();
}

/// A small ext4 filesystem in a file, loop-mounted for the test and unmounted on drop.
struct SmallFs {
    mount: PathBuf,
}

impl SmallFs {
    fn new(dir: &Path, mib: u64) -> SmallFs {
        // SAFETY: geteuid has no preconditions and cannot fail.
        let root = unsafe { libc::geteuid() } == 0;
        assert!(
            root,
            "the full-disk test loop-mounts a filesystem image and must run as root"
        );
        let image = dir.join("small.img");
        let mount = dir.join("mnt");
        std::fs::create_dir_all(&mount).expect("mkdir");
        let file = std::fs::File::create(&image).expect("image");
        file.set_len(mib << 20).expect("size image");
        drop(file);
        run("mkfs.ext4", &["-q", "-F", image.to_str().expect("utf-8")]);
        run(
            "mount",
            &[
                "-o",
                "loop",
                image.to_str().expect("utf-8"),
                mount.to_str().expect("utf-8"),
            ],
        );
        SmallFs { mount }
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.mount).status();
    }
}

fn run(cmd: &str, args: &[&str]) {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{cmd}: {e}"));
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn chunk(i: usize) -> Vec<u8> {
    let mut v = vec![b'a' + (i % 26) as u8; 1 << 20];
    let tag = format!("chunk-{i:06}");
    v[..tag.len()].copy_from_slice(tag.as_bytes());
    v
}

#[test]
fn a_full_disk_refuses_appends_with_507_and_recovers_once_space_is_freed() {
    let dir = temp_dir("ursula-enospc-");
    let fs = SmallFs::new(dir.path(), 200);
    let data = fs.mount.join("data");
    let log = dir.path().join("server.log");
    // The smallest segments (about 48 MiB) so the 200 MiB filesystem holds a few.
    let config = support::write_config(dir.path(), "segment_bytes = 0\n");
    let server = spawn(&data, Some(&config), &[], &log);
    let mut c = server.client();

    assert_eq!(
        c.request("PUT", "/v1/stream/keep", &[TEXT], b"kept bytes")
            .expect("PUT")
            .status,
        201
    );
    assert_eq!(
        c.request("PUT", "/v1/stream/fill", &[TEXT], b"")
            .expect("PUT")
            .status,
        201
    );
    let mut acked = 0;
    let mut refused = None;
    for i in 0..400 {
        let r = c
            .request("POST", "/v1/stream/fill", &[TEXT], &chunk(i))
            .expect("POST");
        if r.is_success() {
            acked += 1;
        } else {
            refused = Some(r);
            break;
        }
    }
    let refused = refused.expect("a 200 MiB filesystem fills up within 400 MiB of appends");
    assert_eq!(refused.status, 507, "{}", refused.body_str());
    assert!(acked > 50, "only {acked} MiB fitted");
    let tail_before = c
        .request("HEAD", "/v1/stream/fill", &[], b"")
        .expect("HEAD")
        .next_offset();

    // Nothing changed by the refusal; reads keep working; a retry is refused the same way.
    let r = c
        .request("POST", "/v1/stream/fill", &[TEXT], &chunk(acked))
        .expect("POST");
    assert_eq!(r.status, 507);
    let head = c
        .request("HEAD", "/v1/stream/fill", &[], b"")
        .expect("HEAD");
    assert_eq!(head.next_offset(), tail_before);
    let want: Vec<u8> = (0..acked).flat_map(chunk).collect();
    assert!(
        read_all(&server, "/v1/stream/fill") == want,
        "filled data intact"
    );
    assert_eq!(read_all(&server, "/v1/stream/keep"), b"kept bytes");

    // Deleting the big stream frees its segments (the cleaner runs every second) and
    // appends succeed again without a restart.
    let r = c
        .request("DELETE", "/v1/stream/fill", &[], b"")
        .expect("DELETE");
    assert!(r.is_success(), "DELETE: {} {}", r.status, r.body_str());
    let started = Instant::now();
    assert_eq!(
        c.request("PUT", "/v1/stream/after", &[TEXT], b"")
            .expect("PUT")
            .status,
        201
    );
    let mut written = 0;
    while written < 60 {
        let r = c
            .request("POST", "/v1/stream/after", &[TEXT], &chunk(written))
            .expect("POST");
        if r.is_success() {
            written += 1;
            continue;
        }
        assert_eq!(r.status, 507, "{}", r.body_str());
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "space was not reclaimed within 30 s of the delete"
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    // Everything acknowledged survives a restart.
    server.sigterm(Duration::from_secs(20));
    let server = spawn(&data, Some(&config), &[], &log);
    assert_eq!(read_all(&server, "/v1/stream/keep"), b"kept bytes");
    let want: Vec<u8> = (0..written).flat_map(chunk).collect();
    assert!(
        read_all(&server, "/v1/stream/after") == want,
        "after data intact"
    );
    let r = server
        .client()
        .request("HEAD", "/v1/stream/fill", &[], b"")
        .expect("HEAD");
    assert_eq!(r.status, 404);
    server.kill9();
    drop(fs);
}
