//! Recovery of a damaged log. The input drives a sequence of valid records (creates,
//! appends, closes, deletes) written as one segment, then damages it: cut it short, flip
//! one byte, or leave garbage after it. Opening the shard must keep exactly the records
//! that end before the damage, rebuild every surviving stream's tail, closure and bytes
//! (read back from disk, CRC-checked), and forget deleted ones. It must never panic.
#![no_main]

use std::collections::BTreeMap;
use std::path::Path;

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use ursula_storage::record::{AppendRec, CreateRec, Lifetime, Record, StreamMeta};
use ursula_storage::segment::{segment_path, SegmentHeader, DATA_START};
use ursula_storage::{Durability, Offset, Shard, ShardConfig};

#[derive(Clone, Default)]
struct Model {
    key: String,
    data: Vec<u8>,
    closed: bool,
}

struct Log {
    /// Encoded records, back to back, and each record's end offset in `body`.
    body: Vec<u8>,
    ends: Vec<usize>,
    /// The model after each record: `states[k]` holds the streams after k records.
    states: Vec<BTreeMap<u64, Model>>,
}

fn build(ops: &[u8]) -> Log {
    let mut log = Log {
        body: Vec::new(),
        ends: Vec::new(),
        states: vec![BTreeMap::new()],
    };
    let mut streams: BTreeMap<u64, Model> = BTreeMap::new();
    let mut next_id = 1u64;
    let mut it = ops.iter().copied();
    while log.ends.len() < 48 {
        let Some(op) = it.next() else { break };
        let arg = it.next().unwrap_or(0);
        let lsn = log.ends.len() as u64 + 1;
        let fill = |n: usize| -> Bytes {
            (0..n)
                .map(|i| (lsn as usize * 31 + i) as u8)
                .collect::<Vec<u8>>()
                .into()
        };
        let live: Vec<u64> = streams.keys().copied().collect();
        let pick = |a: u8| live.get(usize::from(a) % live.len().max(1)).copied();
        let record = match op % 4 {
            0 => {
                let id = next_id;
                next_id += 1;
                let data = fill(usize::from(arg % 64));
                let key = format!("c/s{id}");
                streams.insert(
                    id,
                    Model {
                        key: key.clone(),
                        data: data.to_vec(),
                        closed: false,
                    },
                );
                Record::Create(CreateRec {
                    id,
                    meta: StreamMeta {
                        key: key.into(),
                        incarnation: id,
                        created_ms: 1,
                        content_type: "application/octet-stream".into(),
                        lifetime: Lifetime::Forever,
                        ext: Bytes::new(),
                    },
                    initial: AppendRec {
                        id,
                        start: Offset::ZERO,
                        append_lens: if data.is_empty() {
                            vec![]
                        } else {
                            vec![data.len() as u32]
                        },
                        msg_lens: if data.is_empty() {
                            vec![]
                        } else {
                            vec![data.len() as u32]
                        },
                        data,
                        ..Default::default()
                    },
                })
            }
            1 | 2 => {
                let Some(id) = pick(arg) else { continue };
                let s = streams.get_mut(&id).expect("picked a live stream");
                if s.closed {
                    continue;
                }
                let close = op & 0x80 != 0;
                let data = fill(usize::from(arg) * 7 % 300 + usize::from(!close));
                let rec = AppendRec {
                    id,
                    start: Offset::new(s.data.len() as u64),
                    close,
                    append_lens: if data.is_empty() {
                        vec![]
                    } else {
                        vec![data.len() as u32]
                    },
                    msg_lens: if data.is_empty() {
                        vec![]
                    } else {
                        vec![data.len() as u32]
                    },
                    data: data.clone(),
                    ..Default::default()
                };
                s.data.extend_from_slice(&data);
                s.closed |= close;
                Record::Append(rec)
            }
            _ => {
                let Some(id) = pick(arg) else { continue };
                streams.remove(&id);
                Record::Delete { id }
            }
        };
        record.encode(ursula_storage::Lsn::new(lsn), &mut log.body);
        log.ends.push(log.body.len());
        log.states.push(streams.clone());
    }
    log
}

fn write_segment(dir: &Path, body: &[u8]) {
    let shard_dir = dir.join("shard-0");
    std::fs::create_dir_all(&shard_dir).expect("shard dir");
    let mut file = vec![0u8; DATA_START as usize];
    SegmentHeader {
        shard: 0,
        index: ursula_storage::SegmentNo::new(1),
        first_lsn: ursula_storage::Lsn::FIRST,
    }
    .encode(&mut file);
    file.extend_from_slice(body);
    // Segments are whole blocks, with unwritten (zero) space after the records.
    let len = (file.len() + 4096).div_ceil(4096) * 4096;
    file.resize(len, 0);
    std::fs::write(
        segment_path(&shard_dir, ursula_storage::SegmentNo::new(1)),
        file,
    )
    .expect("write segment");
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 3 {
        return;
    }
    let (mode, at) = (
        data[0] % 4,
        usize::from(u16::from_le_bytes([data[1], data[2]])),
    );
    let log = build(&data[3..]);
    let mut body = log.body.clone();
    match mode {
        1 => body.truncate(at % (body.len() + 1)),
        2 if !body.is_empty() => {
            let p = at % body.len();
            body[p] ^= data[1] | 1;
        }
        3 => {
            // Garbage right after the log (a torn write of records never acknowledged).
            body.extend_from_slice(&data[..3]);
            body.extend_from_slice(&[0xA5; 17]);
        }
        _ => {}
    }
    // The first byte that differs from the intact log (unwritten space reads as zeros, so
    // a cut through trailing zero bytes changes nothing); records ending at or before it
    // must survive, the rest must not.
    let byte = |b: &[u8], i: usize| b.get(i).copied().unwrap_or(0);
    let damage = (0..body.len().max(log.body.len()))
        .find(|&i| byte(&body, i) != byte(&log.body, i))
        .unwrap_or(usize::MAX);
    let survivors = log.ends.iter().filter(|&&end| end <= damage).count();
    let expected = &log.states[survivors];

    let dir = tempdir();
    write_segment(&dir, &body);
    let mut rt = monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
        .enable_timer()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let cfg = ShardConfig::new(0, Durability::Disk(dir.clone()));
        let (shard, report) = Shard::open(cfg)
            .await
            .expect("a damaged tail must not stop recovery");
        assert_eq!(
            report.records, survivors as u64,
            "records kept after damage at {damage}"
        );
        assert_eq!(report.streams, expected.len());
        for (id, m) in expected {
            let sid = {
                let Some(s) = shard.stream_by_key(&m.key) else {
                    panic!("stream {id} ({}) lost", m.key)
                };
                let head = shard.head(s.id()).expect("head");
                assert_eq!(head.tail().get(), m.data.len() as u64, "{}", m.key);
                assert_eq!(s.next_offset(), head.tail());
                assert_eq!((s.is_closed(), head.closed()), (m.closed, m.closed));
                s.id()
            };
            let parts = shard
                .read(sid, Offset::ZERO, Offset::new(m.data.len() as u64))
                .await
                .expect("read back");
            let got: Vec<u8> = parts.iter().flat_map(|b| b.iter().copied()).collect();
            assert!(got == m.data, "{}: bytes differ after recovery", m.key);
        }
        for m in log.states.iter().flat_map(|s| s.values()) {
            if !expected.values().any(|e| e.key == m.key) {
                assert!(shard.lookup(&m.key).is_none(), "{} came back", m.key);
            }
        }
        // Let the shard's background tasks see the stop and end, so nothing outlives the
        // runtime (a task parked on its waker would keep the shard alive).
        shard.shutdown().await.expect("clean stop");
        monoio::time::sleep(std::time::Duration::from_millis(1)).await;
    });
    drop(rt);
    let _ = std::fs::remove_dir_all(&dir);
});

/// A fresh directory per input, on the real filesystem (direct I/O needs one).
fn tempdir() -> std::path::PathBuf {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let base = std::env::var_os("URSULA_FUZZ_TMP")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let dir = base.join(format!(
        "ursula-fuzz-recovery-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}
