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
