//! Torn and corrupt data on disk, through the real binary: a segment cut
//! mid-record, a byte flipped inside a record's data and inside a record header, a damaged
//! segment header, and a removed last segment. The server must start, keep exactly the
//! records before the damage, say in its log what it dropped, and never serve a corrupt
//! byte. Storage-level variants live in `storage/src/shard/tests.rs`.

mod support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use support::{expect, req, temp_dir, write_config, Server};

const TEXT: &str = "text/plain";
const BLOCK: usize = 4096;

/// One core, so there is one log and record order is request order. Segments are as
/// small as the engine allows (one 48 MiB record must fit).
fn start(dir: &Path, log: &Path) -> Server {
    let cfg = write_config(dir, "segment_bytes = 1\n");
    Server::spawn_standard(&dir.join("data"), "disk", 1, &["--config", &cfg], Some(log))
}

fn segment(dir: &Path, index: u64) -> PathBuf {
    dir.join("data")
        .join("shard-0")
        .join(format!("{index:010}.seg"))
}

/// (start, length) of every record in a segment, walking the frame headers.
fn records(seg: &[u8]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut pos = BLOCK;
    while pos + 20 <= seg.len() {
        let len = u32::from_le_bytes(seg[pos..pos + 4].try_into().expect("4 bytes")) as usize;
        let lsn = u64::from_le_bytes(seg[pos + 8..pos + 16].try_into().expect("8 bytes"));
        if len == 0 && lsn == 0 {
            break;
        }
        out.push((pos, 20 + len));
        pos += 20 + len;
    }
    out
}

fn read(s: &Server, path: &str) -> Vec<u8> {
    expect(s, "GET", &format!("{path}?offset=-1"), &[], b"", 200).body
}

/// Appends `parts` one by one (each acknowledged before the next), then kills the server
/// without a clean shutdown, so nothing but the log records the writes.
fn write_then_kill(dir: &Path, log: &Path, parts: &[(&str, &[u8])]) {
    let s = start(dir, log);
    for (path, body) in parts {
        let r = req(&s, "PUT", path, &[("Content-Type", TEXT)], b"");
        assert!(r.status == 201 || r.status == 200, "{r:?}");
        expect(&s, "POST", path, &[("Content-Type", TEXT)], body, 204);
    }
    s.kill9();
}

fn server_log(log: &Path) -> String {
    std::fs::read_to_string(log).unwrap_or_default()
}

#[test]
fn a_segment_cut_mid_record_loses_only_that_record() {
    let dir = temp_dir("ursula-corrupt");
    let log = dir.path().join("server.log");
    write_then_kill(
        dir.path(),
        &log,
        &[
            ("/v1/stream/a", b"one-"),
            ("/v1/stream/a", b"two-"),
            ("/v1/stream/b", b"bee"),
            ("/v1/stream/a", b"three-three-three"),
        ],
    );
    let seg_path = segment(dir.path(), 1);
    let mut seg = std::fs::read(&seg_path).expect("segment");
    let recs = records(&seg);
    let &(last, len) = recs.last().expect("records");
    // A torn write: the last record's final bytes never reached the disk.
    seg[last + len - 5..last + len].fill(0);
    std::fs::write(&seg_path, &seg).expect("write");

    let s = start(dir.path(), &log);
    assert_eq!(read(&s, "/v1/stream/a"), b"one-two-");
    assert_eq!(read(&s, "/v1/stream/b"), b"bee");
    let text = server_log(&log);
    assert!(
        text.contains("truncating there") && text.contains("dropped_bytes"),
        "the log must say what was dropped: {text}"
    );
    // Writing resumes where the torn record was, and survives another crash.
    expect(
        &s,
        "POST",
        "/v1/stream/a",
        &[("Content-Type", TEXT)],
        b"four",
        204,
    );
    s.kill9();
    let s = start(dir.path(), &log);
    assert_eq!(read(&s, "/v1/stream/a"), b"one-two-four");
    s.sigterm(Duration::from_secs(10)).expect("exits");
}

#[test]
fn a_flipped_byte_in_record_data_or_header_ends_the_log_there() {
    for (what, at_header) in [("data", false), ("record header", true)] {
        let dir = temp_dir("ursula-corrupt");
        let log = dir.path().join("server.log");
        write_then_kill(
            dir.path(),
            &log,
            &[
                ("/v1/stream/a", b"AAAA"),
                ("/v1/stream/b", b"BBBB"),
                ("/v1/stream/a", b"CCCC"),
                ("/v1/stream/b", b"DDDD"),
            ],
        );
        let seg_path = segment(dir.path(), 1);
        let mut seg = std::fs::read(&seg_path).expect("segment");
        let recs = records(&seg);
        // Records: create a, append a, create b, append b, append a (CCCC), append b.
        assert_eq!(recs.len(), 6, "{what}: unexpected log layout");
        let (pos, len) = recs[4];
        let at = if at_header { pos + 9 } else { pos + len - 2 };
        seg[at] ^= 0x20;
        std::fs::write(&seg_path, &seg).expect("write");

        let s = start(dir.path(), &log);
        // The log ends before the damaged record: its append and everything after it
        // are gone, everything before is intact.
        assert_eq!(read(&s, "/v1/stream/a"), b"AAAA", "{what}");
        assert_eq!(read(&s, "/v1/stream/b"), b"BBBB", "{what}");
        let a = req(&s, "HEAD", "/v1/stream/a", &[], b"");
        assert_eq!(a.next_offset(), Some(4), "{what}");
        let text = server_log(&log);
        assert!(
            text.contains("truncating there") && text.contains("zeroing the discarded log tail"),
            "{what}: {text}"
        );
        // The zeroed tail stays gone across another restart; new writes land cleanly.
        expect(
            &s,
            "POST",
            "/v1/stream/a",
            &[("Content-Type", TEXT)],
            b"EEEE",
            204,
        );
        s.kill9();
        let s = start(dir.path(), &log);
        assert_eq!(read(&s, "/v1/stream/a"), b"AAAAEEEE", "{what}");
        assert_eq!(read(&s, "/v1/stream/b"), b"BBBB", "{what}");
        s.sigterm(Duration::from_secs(10)).expect("exits");
    }
}

#[test]
fn a_damaged_segment_header_never_silently_discards_acknowledged_records() {
    let dir = temp_dir("ursula-corrupt");
    let log = dir.path().join("server.log");
    write_then_kill(dir.path(), &log, &[("/v1/stream/a", b"acknowledged")]);
    let seg_path = segment(dir.path(), 1);
    let mut seg = std::fs::read(&seg_path).expect("segment");
    seg[20] ^= 0x01; // inside the segment index field, under the header CRC
    std::fs::write(&seg_path, &seg).expect("write");

    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_ursula"))
        .args(["server", "--listen", "127.0.0.1:0", "--cores", "1"])
        .args(["--storage", "disk", "--data-dir"])
        .arg(dir.path().join("data"))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log"))
        .spawn()
        .expect("run ursula");
    let status = support::wait_timeout(&mut child, Duration::from_secs(20));
    if status.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    let stderr = server_log(&log);
    assert!(
        status.is_some_and(|s| !s.success()),
        "the server started over a segment whose header is corrupt: {stderr}"
    );
    assert!(stderr.contains("corrupt header"), "{stderr}");
    assert!(
        seg_path.exists(),
        "the segment holding acknowledged records was deleted"
    );
}

#[test]
fn a_removed_last_segment_leaves_a_consistent_prefix() {
    let dir = temp_dir("ursula-corrupt");
    let log = dir.path().join("server.log");
    let s = start(dir.path(), &log);
    expect(
        &s,
        "PUT",
        "/v1/stream/big",
        &[("Content-Type", "application/octet-stream")],
        b"",
        201,
    );
    // Segments are about 48 MiB here, so two 30 MiB appends need two.
    let first: Vec<u8> = (0..30 << 20).map(|i| (i % 251) as u8).collect();
    let second = vec![b'2'; 30 << 20];
    for body in [&first, &second] {
        expect(
            &s,
            "POST",
            "/v1/stream/big",
            &[("Content-Type", "application/octet-stream")],
            body,
            204,
        );
    }
    s.kill9();
    assert!(segment(dir.path(), 2).exists(), "expected the log to roll");
    std::fs::remove_file(segment(dir.path(), 2)).expect("remove");

    let s = start(dir.path(), &log);
    let h = req(&s, "HEAD", "/v1/stream/big", &[], b"");
    assert_eq!(h.status, 200);
    assert_eq!(h.next_offset(), Some(first.len() as u64));
    let r = expect(
        &s,
        "GET",
        &format!("/v1/stream/big?offset={}", first.len() - 100),
        &[],
        b"",
        200,
    );
    assert_eq!(r.body, &first[first.len() - 100..]);
    // The stream continues from the surviving prefix.
    expect(
        &s,
        "POST",
        "/v1/stream/big",
        &[("Content-Type", "application/octet-stream")],
        b"xyz",
        204,
    );
    s.kill9();
    let s = start(dir.path(), &log);
    let h = req(&s, "HEAD", "/v1/stream/big", &[], b"");
    assert_eq!(h.next_offset(), Some(first.len() as u64 + 3));
}
