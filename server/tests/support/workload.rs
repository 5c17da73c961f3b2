//! The long-mode crash workload and its checker, shared by the `kill -9` crash test and the
//! power-loss test: many streams on the bucketed surface, every kind of write (text,
//! binary, JSON with record ranges, idempotent producers and their retries, append-batch,
//! close-with-append, close, delete and recreate, snapshots and retention), and a model that
//! verifies a restarted server against everything acknowledged.
//!
//! Each stream slot is owned by exactly one writer thread, so the model of a slot is an
//! exact sequence of acknowledged operations plus at most one operation in flight at the
//! crash. After a restart that in-flight operation must be either absent or whole (an
//! append-batch: a prefix of whole frames), never partial, and everything acknowledged
//! must be there byte-exact at its acknowledged offsets with its acknowledged record
//! ordinals; producer retries must still be deduplicated with their original receipts;
//! the acknowledged snapshot (or one published after it) reads back byte-exact, the
//! acknowledged retention point holds (reads before it get `410`, reads after it are
//! byte-exact, record ordinals unchanged); closed streams stay closed, deleted ones stay
//! deleted, and `Stream-Incarnation` is unchanged for surviving streams and new for
//! recreated ones.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use super::{offset_token, Client, Response, Rng};
pub const BUCKET: &str = "crashlong";
pub const SLOTS: usize = 12;
pub const WRITERS: usize = 4;
/// A stream whose log grows past this is closed or deleted (bounds memory and reads).
pub const STREAM_CAP: usize = 6 << 20;
pub const MAX_READ: usize = 8 * 1024 * 1024;
pub const PRODUCER_ID: &str = "long-producer";
pub const PRODUCER_EPOCH: &str = "1";
/// Receipts kept in the model (below the server's default window of 256).
pub const RECEIPTS_KEPT: usize = 200;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kind {
    Text,
    Binary,
    Json,
}

pub fn kind_of(slot: usize) -> (&'static str, Kind) {
    match slot % 3 {
        0 => ("text/plain", Kind::Text),
        1 => ("application/octet-stream", Kind::Binary),
        _ => ("application/json", Kind::Json),
    }
}

pub fn path_of(slot: usize) -> String {
    format!("/{BUCKET}/s{slot}")
}

#[derive(Clone, Debug)]
pub struct Receipt {
    pub seq: u64,
    pub body: Vec<u8>,
    pub next: u64,
    /// Record range (JSON streams).
    pub rec: Option<(u64, u64)>,
    pub closes: bool,
}

/// A published snapshot: its offset, blob and the blob's content type.
#[derive(Clone, Debug)]
pub struct Snapshot {
    pub offset: u64,
    pub ctype: &'static str,
    pub blob: Vec<u8>,
}

/// Content types snapshot blobs are published with (already in normal form).
const SNAPSHOT_TYPES: [&str; 2] = ["application/octet-stream", "application/vnd.state+json"];

/// The operation a slot's writer had in flight when the server died.
#[derive(Clone, Debug, Default)]
pub enum Pending {
    #[default]
    None,
    Append {
        canonical: Vec<u8>,
        records: u64,
        closes: bool,
        /// (seq, body) for producer appends.
        producer: Option<(u64, Vec<u8>)>,
    },
    /// (canonical bytes, records) per frame.
    Batch(Vec<(Vec<u8>, u64)>),
    Close,
    Delete,
    Create,
    Snapshot(Snapshot),
    /// A retention advance to this offset.
    Retain(u64),
}

#[derive(Default)]
pub struct Slot {
    pub exists: bool,
    /// Current incarnation (None: created but not yet seen on a HEAD).
    pub incarnation: Option<String>,
    /// Every incarnation this URL has had.
    pub past: HashSet<String>,
    pub closed: bool,
    pub log: Vec<u8>,
    pub records: u64,
    pub next_seq: u64,
    pub receipts: Vec<Receipt>,
    /// The visible snapshot, as acknowledged.
    pub snapshot: Option<Snapshot>,
    /// The acknowledged retention point (earliest readable offset).
    pub retained: u64,
    /// Ends of acknowledged appends and frames: message boundaries for snapshots and
    /// retention.
    pub bounds: Vec<u64>,
    pub pending: Pending,
}

impl Slot {
    pub fn reset_data(&mut self) {
        self.log.clear();
        self.records = 0;
        self.closed = false;
        self.next_seq = 0;
        self.receipts.clear();
        self.snapshot = None;
        self.retained = 0;
        self.bounds.clear();
    }

    /// Append acknowledged (or recovered) canonical bytes, one message.
    pub fn extend(&mut self, canonical: &[u8], records: u64) {
        self.log.extend_from_slice(canonical);
        self.records += records;
        self.bounds.push(self.log.len() as u64);
    }

    pub fn push_receipt(&mut self, r: Receipt) {
        self.next_seq = r.seq + 1;
        self.receipts.push(r);
        if self.receipts.len() > RECEIPTS_KEPT {
            self.receipts.remove(0);
        }
    }
}

#[derive(Default, Clone, Copy)]
pub struct Stats {
    pub appends: u64,
    pub producer: u64,
    pub batches: u64,
    pub frames: u64,
    pub closes: u64,
    pub deletes: u64,
    pub creates: u64,
    pub refused_closed: u64,
    pub bytes: u64,
    pub rejected_503: u64,
    pub in_flight: u64,
    pub snapshots: u64,
    pub retentions: u64,
    /// Producer appends retried at once (answered as duplicates).
    pub retries: u64,
}

impl Stats {
    pub fn add(&mut self, o: &Stats) {
        self.appends += o.appends;
        self.producer += o.producer;
        self.batches += o.batches;
        self.frames += o.frames;
        self.closes += o.closes;
        self.deletes += o.deletes;
        self.creates += o.creates;
        self.refused_closed += o.refused_closed;
        self.bytes += o.bytes;
        self.rejected_503 += o.rejected_503;
        self.in_flight += o.in_flight;
        self.snapshots += o.snapshots;
        self.retentions += o.retentions;
        self.retries += o.retries;
    }
}

pub fn filler(rng: &mut Rng, kind: Kind, n: usize, out: &mut Vec<u8>) {
    const ALNUM: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    let mut x = 0;
    for i in 0..n {
        if i % 8 == 0 {
            x = rng.next_u64();
        }
        let b = (x >> ((i % 8) * 8)) as u8;
        out.push(match kind {
            Kind::Binary => b,
            Kind::Text | Kind::Json => ALNUM[b as usize % ALNUM.len()],
        });
    }
}

/// (request body, canonical log bytes, records created).
pub fn make_payload(rng: &mut Rng, kind: Kind, tag: &str, size: usize) -> (Vec<u8>, Vec<u8>, u64) {
    match kind {
        Kind::Text | Kind::Binary => {
            let mut b = tag.as_bytes().to_vec();
            filler(rng, kind, size.saturating_sub(b.len()), &mut b);
            (b.clone(), b, 0)
        }
        Kind::Json => {
            let msgs = if rng.chance(0.3) {
                rng.range(2, 5) as usize
            } else {
                1
            };
            let per = (size / msgs).max(1);
            let mut objs = Vec::new();
            for m in 0..msgs {
                let mut o = format!("{{\"t\":\"{tag}{m}\",\"p\":\"").into_bytes();
                filler(rng, Kind::Json, per.saturating_sub(o.len() + 2), &mut o);
                o.extend_from_slice(b"\"}");
                objs.push(o);
            }
            let mut canonical = Vec::new();
            for o in &objs {
                canonical.extend_from_slice(o);
                canonical.push(b'\n');
            }
            let body = if msgs == 1 && rng.chance(0.7) {
                objs.pop().unwrap()
            } else {
                let mut b = vec![b'['];
                b.extend_from_slice(&objs.join(&b","[..]));
                b.push(b']');
                b
            };
            (body, canonical, msgs as u64)
        }
    }
}

pub fn payload_size(rng: &mut Rng) -> usize {
    if rng.chance(0.01) {
        1 << 20
    } else {
        rng.log_size(64, 256 * 1024)
    }
}

pub fn hnum(resp: &Response, name: &str) -> Option<u64> {
    resp.header(name).and_then(|v| v.trim().parse().ok())
}

pub fn closed_hdr(resp: &Response) -> bool {
    resp.header("stream-closed") == Some("true")
}

pub fn records_in(b: &[u8]) -> u64 {
    b.iter().filter(|&&c| c == b'\n').count() as u64
}

/// Split the elements of a top-level JSON array (each + LF, trimmed).
pub fn split_array(body: &[u8]) -> Result<Vec<Vec<u8>>, String> {
    let s = body.trim_ascii();
    if s.first() != Some(&b'[') || s.last() != Some(&b']') {
        return Err(format!(
            "body is not a JSON array: {:?}",
            String::from_utf8_lossy(&s[..s.len().min(80)])
        ));
    }
    let inner = &s[1..s.len() - 1];
    let mut out = Vec::new();
    let (mut depth, mut in_str, mut esc, mut start) = (0i32, false, false, 0usize);
    for (i, &c) in inner.iter().enumerate() {
        if in_str {
            if esc {
                esc = false;
            } else if c == b'\\' {
                esc = true;
            } else if c == b'"' {
                in_str = false;
            }
            continue;
        }
        match c {
            b'"' => in_str = true,
            b'{' | b'[' => depth += 1,
            b'}' | b']' => depth -= 1,
            b',' if depth == 0 => {
                out.push(inner[start..i].trim_ascii().to_vec());
                start = i + 1;
            }
            _ => {}
        }
    }
    if !inner.trim_ascii().is_empty() {
        out.push(inner[start..].trim_ascii().to_vec());
    }
    if out.iter().any(|e| e.is_empty()) {
        return Err("empty element in JSON array".into());
    }
    Ok(out)
}

/// A number or a decimal string field of a flat JSON object.
pub fn json_field(obj: &[u8], key: &str) -> Option<u64> {
    let s = std::str::from_utf8(obj).ok()?;
    let pat = format!("\"{key}\":");
    let rest = s[s.find(&pat)? + pat.len()..].trim_start();
    let rest = rest.strip_prefix('"').unwrap_or(rest);
    let end = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

/// Outcome of one writer operation.
pub enum Op {
    Done,
    /// Server gone (the op, if sent, is recorded as pending).
    Stop,
}

pub struct Writer {
    id: usize,
    rng: Rng,
    client: Client,
    stats: Stats,
    errors: Vec<String>,
    cycle: usize,
    n: u64,
}

impl Writer {
    pub fn err(&mut self, slot: usize, msg: String) -> Op {
        let m = format!("s{slot}: {msg}");
        eprintln!("crash_long writer {} error: {m}", self.id);
        self.errors.push(m);
        Op::Stop
    }

    pub fn tag(&mut self) -> String {
        self.n += 1;
        format!("c{}w{}n{}|", self.cycle, self.id, self.n)
    }

    /// Send a request; on connect failure nothing was sent (Stop, no pending); on a
    /// failure after sending, `pending` is recorded.
    pub fn send(
        &mut self,
        s: &mut Slot,
        pending: Pending,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Option<Response> {
        if self.client.connect().is_err() {
            return None;
        }
        match self.client.request(method, path, headers, body) {
            Ok(r) => Some(r),
            Err(_) => {
                self.stats.in_flight += 1;
                s.pending = pending;
                None
            }
        }
    }

    pub fn step(&mut self, slot: usize, s: &mut Slot) -> Op {
        let (ctype, kind) = kind_of(slot);
        let path = path_of(slot);
        if !s.exists {
            if self.rng.chance(0.3) {
                return Op::Done; // leave it deleted for a while
            }
            let Some(r) = self.send(
                s,
                Pending::Create,
                "PUT",
                &path,
                &[("Content-Type", ctype)],
                &[],
            ) else {
                return Op::Stop;
            };
            if r.status != 201 {
                return self.err(slot, format!("create: {} {}", r.status, r.body_str()));
            }
            self.stats.creates += 1;
            s.exists = true;
            s.incarnation = None;
            s.reset_data();
            if self.client.connect().is_err() {
                return Op::Stop;
            }
            let Ok(h) = self.client.request("HEAD", &path, &[], &[]) else {
                return Op::Stop;
            };
            let Some(inc) = h.header("stream-incarnation").map(str::to_string) else {
                return self.err(
                    slot,
                    format!("HEAD after create: {} without incarnation", h.status),
                );
            };
            if !s.past.insert(inc.clone()) {
                return self.err(slot, format!("recreated stream reuses incarnation {inc}"));
            }
            s.incarnation = Some(inc);
            return Op::Done;
        }
        if s.closed {
            if self.rng.chance(0.5) {
                // Must be refused; nothing may land (so no pending is recorded).
                let (body, _, _) = make_payload(&mut self.rng, kind, "closed|", 64);
                let Some(r) = self.send(
                    s,
                    Pending::None,
                    "POST",
                    &path,
                    &[("Content-Type", ctype)],
                    &body,
                ) else {
                    return Op::Stop;
                };
                if r.status != 409 || !closed_hdr(&r) || r.next_offset() != Some(s.log.len() as u64)
                {
                    return self.err(
                        slot,
                        format!(
                            "append to closed stream: {} closed={:?} tail {:?} (model {})",
                            r.status,
                            r.header("stream-closed"),
                            r.next_offset(),
                            s.log.len()
                        ),
                    );
                }
                self.stats.refused_closed += 1;
                return Op::Done;
            }
            return self.delete(slot, s);
        }
        if s.log.len() > STREAM_CAP {
            return if self.rng.chance(0.5) {
                self.close(slot, s, true)
            } else {
                self.delete(slot, s)
            };
        }
        let p = self.rng.range(0, 99);
        match p {
            0..=44 => self.append(slot, s, false, false),
            45..=64 => self.append(slot, s, true, false),
            65..=84 => self.batch(slot, s),
            85..=86 => {
                let producer = self.rng.chance(0.5);
                self.append(slot, s, producer, true)
            }
            87 => self.close(slot, s, false),
            88..=89 => self.delete(slot, s),
            90..=93 => self.snapshot(slot, s),
            94..=96 => self.retain(slot, s),
            _ => self.append(slot, s, false, false),
        }
    }

    pub fn delete(&mut self, slot: usize, s: &mut Slot) -> Op {
        let Some(r) = self.send(s, Pending::Delete, "DELETE", &path_of(slot), &[], &[]) else {
            return Op::Stop;
        };
        if r.status != 204 {
            return self.err(slot, format!("delete: {} {}", r.status, r.body_str()));
        }
        self.stats.deletes += 1;
        s.exists = false;
        s.incarnation = None;
        s.reset_data();
        Op::Done
    }

    /// Close, empty (`with_body` false) or with a final append.
    pub fn close(&mut self, slot: usize, s: &mut Slot, with_body: bool) -> Op {
        if with_body {
            return self.append(slot, s, false, true);
        }
        let Some(r) = self.send(
            s,
            Pending::Close,
            "POST",
            &path_of(slot),
            &[("Stream-Closed", "true")],
            &[],
        ) else {
            return Op::Stop;
        };
        if r.status != 204 || !closed_hdr(&r) || r.next_offset() != Some(s.log.len() as u64) {
            return self.err(
                slot,
                format!(
                    "close: {} closed={:?} tail {:?} model {}",
                    r.status,
                    r.header("stream-closed"),
                    r.next_offset(),
                    s.log.len()
                ),
            );
        }
        if kind_of(slot).1 == Kind::Json
            && (hnum(&r, "stream-record-start") != Some(s.records)
                || hnum(&r, "stream-record-next") != Some(s.records))
        {
            return self.err(
                slot,
                format!(
                    "close: record headers {:?}/{:?}, model N {}",
                    r.header("stream-record-start"),
                    r.header("stream-record-next"),
                    s.records
                ),
            );
        }
        self.stats.closes += 1;
        s.closed = true;
        Op::Done
    }

    pub fn append(&mut self, slot: usize, s: &mut Slot, producer: bool, closes: bool) -> Op {
        let (ctype, kind) = kind_of(slot);
        let tag = self.tag();
        let size = payload_size(&mut self.rng);
        let (body, canonical, recs) = make_payload(&mut self.rng, kind, &tag, size);
        let seq_s = s.next_seq.to_string();
        let mut headers = vec![("Content-Type", ctype)];
        if producer {
            headers.push(("Producer-Id", PRODUCER_ID));
            headers.push(("Producer-Epoch", PRODUCER_EPOCH));
            headers.push(("Producer-Seq", &seq_s));
        }
        if closes {
            headers.push(("Stream-Closed", "true"));
        }
        let pending = Pending::Append {
            canonical: canonical.clone(),
            records: recs,
            closes,
            producer: producer.then(|| (s.next_seq, body.clone())),
        };
        let Some(r) = self.send(s, pending, "POST", &path_of(slot), &headers, &body) else {
            return Op::Stop;
        };
        if r.status == 503 {
            self.stats.rejected_503 += 1;
            thread::sleep(Duration::from_millis(10));
            return Op::Done;
        }
        // A new producer seq is accepted with 200 (204 would be a duplicate).
        let ok = if producer && !closes {
            r.status == 200
        } else {
            matches!(r.status, 200 | 204)
        };
        if !ok {
            return self.err(
                slot,
                format!(
                    "append (producer {producer}, close {closes}): {} {}",
                    r.status,
                    r.body_str()
                ),
            );
        }
        let want = (s.log.len() + canonical.len()) as u64;
        if r.next_offset() != Some(want) {
            return self.err(
                slot,
                format!(
                    "append: Stream-Next-Offset {:?}, expected {want}",
                    r.next_offset()
                ),
            );
        }
        if producer && r.header("producer-seq") != Some(seq_s.as_str()) {
            return self.err(
                slot,
                format!(
                    "producer append seq {seq_s}: {} Producer-Seq {:?}",
                    r.status,
                    r.header("producer-seq")
                ),
            );
        }
        if closes && !closed_hdr(&r) {
            return self.err(slot, "append-and-close without Stream-Closed: true".into());
        }
        let rec = if kind == Kind::Json {
            let got = (
                hnum(&r, "stream-record-start"),
                hnum(&r, "stream-record-next"),
            );
            if got != (Some(s.records), Some(s.records + recs)) {
                return self.err(
                    slot,
                    format!(
                        "append: record range {got:?}, expected {}..{}",
                        s.records,
                        s.records + recs
                    ),
                );
            }
            Some((s.records, s.records + recs))
        } else {
            None
        };
        self.stats.appends += 1;
        self.stats.bytes += canonical.len() as u64;
        s.extend(&canonical, recs);
        if closes {
            s.closed = true;
            self.stats.closes += 1;
        }
        if producer {
            self.stats.producer += 1;
            let seq = s.next_seq;
            let receipt = Receipt {
                seq,
                body,
                next: want,
                rec,
                closes,
            };
            s.push_receipt(receipt.clone());
            if self.rng.chance(0.2) {
                // A client that lost the answer sends the same append again: it must be
                // answered as a duplicate and never land twice (verification would find
                // the extra bytes, since nothing is recorded as in flight).
                let Ok(r) = producer_retry(&mut self.client, slot, &receipt) else {
                    return Op::Stop;
                };
                if let Err(e) = check_retry_answer(slot, s, &receipt, &r) {
                    return self.err(slot, e);
                }
                self.stats.retries += 1;
            }
        }
        Op::Done
    }

    /// Publish a snapshot at a message boundary at or after the visible one: usually the
    /// tail, sometimes an earlier boundary; at the visible snapshot's own offset the same
    /// blob again (idempotent).
    pub fn snapshot(&mut self, slot: usize, s: &mut Slot) -> Op {
        let floor = s.snapshot.as_ref().map_or(s.retained, |v| v.offset);
        let offset = if self.rng.chance(0.3) {
            let above: Vec<u64> = s.bounds.iter().copied().filter(|&b| b >= floor).collect();
            match above.len() {
                0 => s.log.len() as u64,
                n => above[self.rng.range(0, n as u64 - 1) as usize],
            }
        } else {
            s.log.len() as u64
        };
        let snap = match &s.snapshot {
            Some(v) if v.offset == offset => v.clone(),
            _ => {
                let size = if self.rng.chance(0.03) {
                    4 << 20
                } else {
                    self.rng.log_size(16, 512 * 1024)
                };
                let mut blob = Vec::with_capacity(size);
                filler(&mut self.rng, Kind::Binary, size, &mut blob);
                let ctype = SNAPSHOT_TYPES[self.rng.range(0, 1) as usize];
                Snapshot {
                    offset,
                    ctype,
                    blob,
                }
            }
        };
        let path = format!("{}/snapshot/{}", path_of(slot), offset_token(offset));
        let Some(r) = self.send(
            s,
            Pending::Snapshot(snap.clone()),
            "PUT",
            &path,
            &[("Content-Type", snap.ctype)],
            &snap.blob,
        ) else {
            return Op::Stop;
        };
        if r.status != 204 || hnum(&r, "stream-snapshot-offset") != Some(offset) {
            return self.err(
                slot,
                format!(
                    "snapshot at {offset}: {} Stream-Snapshot-Offset {:?} {}",
                    r.status,
                    r.header("stream-snapshot-offset"),
                    r.body_str()
                ),
            );
        }
        self.stats.snapshots += 1;
        s.snapshot = Some(snap);
        Op::Done
    }

    /// Advance retention to a message boundary between the current point and the visible
    /// snapshot (publishing one first if there is none).
    pub fn retain(&mut self, slot: usize, s: &mut Slot) -> Op {
        let Some(snap) = s.snapshot.as_ref().map(|v| v.offset) else {
            return self.snapshot(slot, s);
        };
        let between: Vec<u64> = s
            .bounds
            .iter()
            .copied()
            .filter(|&b| b >= s.retained && b <= snap)
            .collect();
        let offset = if between.is_empty() || self.rng.chance(0.5) {
            snap
        } else {
            between[self.rng.range(0, between.len() as u64 - 1) as usize]
        };
        let path = format!("{}/retention/{}", path_of(slot), offset_token(offset));
        let Some(r) = self.send(s, Pending::Retain(offset), "PUT", &path, &[], &[]) else {
            return Op::Stop;
        };
        if r.status != 204 || hnum(&r, "stream-retained-offset") != Some(offset) {
            return self.err(
                slot,
                format!(
                    "retention to {offset}: {} Stream-Retained-Offset {:?} {}",
                    r.status,
                    r.header("stream-retained-offset"),
                    r.body_str()
                ),
            );
        }
        if kind_of(slot).1 == Kind::Json {
            let first = records_in(&s.log[..offset as usize]);
            if hnum(&r, "stream-record-first") != Some(first) {
                return self.err(
                    slot,
                    format!(
                        "retention to {offset}: Stream-Record-First {:?}, expected {first}",
                        r.header("stream-record-first")
                    ),
                );
            }
        }
        self.stats.retentions += 1;
        s.retained = offset;
        Op::Done
    }

    pub fn batch(&mut self, slot: usize, s: &mut Slot) -> Op {
        let (ctype, kind) = kind_of(slot);
        let n = self.rng.range(1, 12) as usize;
        let mut body = Vec::new();
        let mut frames = Vec::new();
        for _ in 0..n {
            let tag = self.tag();
            let size = self.rng.log_size(8, 64 * 1024);
            let (b, canonical, recs) = make_payload(&mut self.rng, kind, &tag, size);
            body.extend_from_slice(&(b.len() as u32).to_be_bytes());
            body.extend_from_slice(&b);
            frames.push((canonical, recs));
        }
        let path = format!("{}/append-batch", path_of(slot));
        let Some(r) = self.send(
            s,
            Pending::Batch(frames.clone()),
            "POST",
            &path,
            &[("Content-Type", ctype)],
            &body,
        ) else {
            return Op::Stop;
        };
        if r.status != 200 {
            return self.err(slot, format!("append-batch: {} {}", r.status, r.body_str()));
        }
        let acks = match split_array(&r.body) {
            Ok(a) => a,
            Err(e) => return self.err(slot, format!("append-batch response: {e}")),
        };
        if acks.len() != frames.len() {
            return self.err(
                slot,
                format!(
                    "append-batch: {} acks for {} frames",
                    acks.len(),
                    frames.len()
                ),
            );
        }
        let mut committed_any = false;
        for (ack, (canonical, recs)) in acks.iter().zip(frames) {
            let status = json_field(ack, "status");
            if status == Some(503) {
                self.stats.rejected_503 += 1;
                continue;
            }
            if status != Some(204) {
                return self.err(
                    slot,
                    format!("append-batch frame: {}", String::from_utf8_lossy(ack)),
                );
            }
            let want = (s.log.len() + canonical.len()) as u64;
            if json_field(ack, "stream_next_offset") != Some(want) {
                return self.err(
                    slot,
                    format!(
                        "append-batch frame: expected next {want}: {}",
                        String::from_utf8_lossy(ack)
                    ),
                );
            }
            if kind == Kind::Json {
                let got = (
                    json_field(ack, "stream_record_start"),
                    json_field(ack, "stream_record_next"),
                );
                if got != (Some(s.records), Some(s.records + recs)) {
                    return self.err(
                        slot,
                        format!(
                            "append-batch frame: records {got:?}, expected {}..{}",
                            s.records,
                            s.records + recs
                        ),
                    );
                }
            }
            committed_any = true;
            self.stats.frames += 1;
            self.stats.bytes += canonical.len() as u64;
            s.extend(&canonical, recs);
        }
        if committed_any && r.next_offset() != Some(s.log.len() as u64) {
            return self.err(
                slot,
                format!(
                    "append-batch: outer Stream-Next-Offset {:?}, model {}",
                    r.next_offset(),
                    s.log.len()
                ),
            );
        }
        self.stats.batches += 1;
        Op::Done
    }
}

pub fn run_writer(
    id: usize,
    addr: String,
    mut slots: Vec<(usize, Slot)>,
    stop: Arc<AtomicBool>,
    seed: u64,
    cycle: usize,
) -> (Vec<(usize, Slot)>, Stats, Vec<String>) {
    let mut w = Writer {
        id,
        rng: Rng::new(seed),
        client: Client::new(&addr),
        stats: Stats::default(),
        errors: Vec::new(),
        cycle,
        n: 0,
    };
    while !stop.load(Ordering::Relaxed) {
        let k = w.rng.range(0, slots.len() as u64 - 1) as usize;
        let (slot, s) = &mut slots[k];
        if let Op::Stop = w.step(*slot, s) {
            break;
        }
    }
    (slots, w.stats, w.errors)
}

/// Read a stream's canonical log from `from` (its retention point; `-1` when that is 0)
/// to the tail by offset catch-up reads.
pub fn read_log(client: &mut Client, slot: usize, from: u64) -> Result<Vec<u8>, String> {
    let mut log = Vec::new();
    let mut offset = if from == 0 {
        "-1".to_string()
    } else {
        offset_token(from)
    };
    loop {
        let path = format!("{}?offset={offset}", path_of(slot));
        let resp = client
            .request("GET", &path, &[], &[])
            .map_err(|e| format!("GET {path}: {e}"))?;
        if resp.status != 200 {
            return Err(format!("GET {path}: {} {}", resp.status, resp.body_str()));
        }
        if resp.body.len() > MAX_READ {
            return Err(format!("GET {path}: body of {} bytes", resp.body.len()));
        }
        let next = resp
            .next_offset()
            .ok_or_else(|| format!("GET {path}: no Stream-Next-Offset"))?;
        let up_to_date = resp.header("stream-up-to-date") == Some("true");
        // Bucketed surface: JSON offset reads are canonical NDJSON, like the log.
        let chunk = resp.body;
        if next != from + (log.len() + chunk.len()) as u64 {
            return Err(format!(
                "GET {path}: Stream-Next-Offset {next} but {} bytes read from {from}",
                log.len() + chunk.len()
            ));
        }
        log.extend_from_slice(&chunk);
        if up_to_date {
            return Ok(log);
        }
        if chunk.is_empty() {
            return Err(format!("GET {path}: empty body but not up to date"));
        }
        offset = offset_token(next);
    }
}

/// Read records `[r, N)` (`r` at or after the first retained record `first`) by record
/// coordinates in random page sizes and compare with the log (record `i` starts after the
/// `i`-th LF).
pub fn check_records(
    client: &mut Client,
    rng: &mut Rng,
    slot: usize,
    log: &[u8],
    first: u64,
) -> Result<(), String> {
    let mut starts = vec![0usize];
    for (i, &c) in log.iter().enumerate() {
        if c == b'\n' {
            starts.push(i + 1);
        }
    }
    let n = (starts.len() - 1) as u64;
    let mut r = if rng.chance(0.3) {
        first
    } else {
        rng.range(first, n)
    };
    loop {
        let m = rng.range(1, 64);
        let path = format!("{}?record={r}&max_records={m}", path_of(slot));
        let resp = client
            .request("GET", &path, &[], &[])
            .map_err(|e| format!("GET {path}: {e}"))?;
        if resp.status != 200 {
            return Err(format!("GET {path}: {} {}", resp.status, resp.body_str()));
        }
        let got = (
            hnum(&resp, "stream-record-first"),
            hnum(&resp, "stream-record-start"),
        );
        if got != (Some(first), Some(r)) {
            return Err(format!(
                "GET {path}: First/Start {got:?}, expected ({first}, {r})"
            ));
        }
        let next = hnum(&resp, "stream-record-next")
            .ok_or_else(|| format!("GET {path}: no Stream-Record-Next"))?;
        if next <= r && r < n || next > n || next > r + m {
            return Err(format!("GET {path}: Stream-Record-Next {next} (N {n})"));
        }
        let (a, b) = (starts[r as usize], starts[next as usize]);
        if resp.body != log[a..b] {
            return Err(format!(
                "GET {path}: records {r}..{next} differ from offsets {a}..{b} of the log"
            ));
        }
        if resp.next_offset() != Some(b as u64) {
            return Err(format!(
                "GET {path}: Stream-Next-Offset {:?}, O({next}) = {b}",
                resp.next_offset()
            ));
        }
        let utd = resp.header("stream-up-to-date") == Some("true");
        if utd != (next == n) {
            return Err(format!(
                "GET {path}: Stream-Up-To-Date {utd} with Next {next} of {n}"
            ));
        }
        if next == n {
            return Ok(());
        }
        r = next;
    }
}

/// Retry an acknowledged producer append: 204, original receipt, nothing appended.
pub fn check_dedup(client: &mut Client, slot: usize, s: &Slot, rc: &Receipt) -> Result<(), String> {
    let r = producer_retry(client, slot, rc).map_err(|e| format!("producer retry: {e}"))?;
    check_retry_answer(slot, s, rc, &r)
}

/// Send an acknowledged producer append again, exactly as it was sent.
pub fn producer_retry(client: &mut Client, slot: usize, rc: &Receipt) -> std::io::Result<Response> {
    let ctype = kind_of(slot).0;
    let seq_s = rc.seq.to_string();
    let mut headers = vec![
        ("Content-Type", ctype),
        ("Producer-Id", PRODUCER_ID),
        ("Producer-Epoch", PRODUCER_EPOCH),
        ("Producer-Seq", seq_s.as_str()),
    ];
    if rc.closes {
        headers.push(("Stream-Closed", "true"));
    }
    client.request("POST", &path_of(slot), &headers, &rc.body)
}

/// The answer to a retried producer append: a duplicate with the original receipt.
pub fn check_retry_answer(slot: usize, s: &Slot, rc: &Receipt, r: &Response) -> Result<(), String> {
    let kind = kind_of(slot).1;
    let highest = s.receipts.last().unwrap().seq.to_string();
    if r.status != 204 {
        return Err(format!(
            "retry of producer seq {}: {} {}",
            rc.seq,
            r.status,
            r.body_str()
        ));
    }
    if r.header("producer-seq") != Some(highest.as_str()) {
        return Err(format!(
            "retry of producer seq {}: Producer-Seq {:?}, highest {highest}",
            rc.seq,
            r.header("producer-seq")
        ));
    }
    if r.next_offset() != Some(rc.next) {
        return Err(format!(
            "retry of producer seq {}: Stream-Next-Offset {:?}, original {}",
            rc.seq,
            r.next_offset(),
            rc.next
        ));
    }
    if kind == Kind::Json {
        let got = (
            hnum(r, "stream-record-start"),
            hnum(r, "stream-record-next"),
        );
        if got != (rc.rec.map(|x| x.0), rc.rec.map(|x| x.1)) {
            return Err(format!(
                "retry of producer seq {}: records {got:?}, original {:?}",
                rc.seq, rc.rec
            ));
        }
    }
    if s.closed && !closed_hdr(r) {
        return Err(format!(
            "retry of producer seq {} on a closed stream without Stream-Closed",
            rc.seq
        ));
    }
    Ok(())
}

/// Verify one slot after a restart and resolve its in-flight operation.
pub fn verify_slot(
    client: &mut Client,
    rng: &mut Rng,
    slot: usize,
    s: &mut Slot,
) -> Result<String, String> {
    let path = path_of(slot);
    let pending = std::mem::take(&mut s.pending);
    let h = client
        .request("HEAD", &path, &[], &[])
        .map_err(|e| format!("HEAD: {e}"))?;
    let mut outcome = String::new();
    match (&pending, h.status) {
        (Pending::Delete, 404) => {
            s.exists = false;
            s.incarnation = None;
            s.reset_data();
            outcome = "in-flight delete applied".into();
        }
        (Pending::Create, 404) => outcome = "in-flight create absent".into(),
        (Pending::Create, 200) => {
            s.exists = true;
            s.incarnation = None;
            s.reset_data();
            outcome = "in-flight create applied".into();
        }
        _ => {}
    }
    if !s.exists {
        if h.status != 404 {
            return Err(format!("deleted stream answers HEAD {}", h.status));
        }
        return Ok(outcome);
    }
    if h.status != 200 {
        return Err(format!(
            "HEAD {} on a live stream ({} bytes acknowledged)",
            h.status,
            s.log.len()
        ));
    }
    let inc = h
        .header("stream-incarnation")
        .ok_or("HEAD without Stream-Incarnation")?
        .to_string();
    match &s.incarnation {
        Some(i) if *i != inc => {
            return Err(format!(
                "Stream-Incarnation changed across restart: {i} -> {inc}"
            ))
        }
        Some(_) => {}
        None => {
            if !s.past.insert(inc.clone()) {
                return Err(format!("recreated stream reuses incarnation {inc}"));
            }
            s.incarnation = Some(inc);
        }
    }
    let retained = check_retention(client, rng, slot, s, &h, &pending, &mut outcome)?;
    check_snapshot(client, slot, s, &h, &pending, &mut outcome)?;
    // Below the retention point the acknowledged bytes are gone by design (and `410`).
    let mut log = s.log[..retained as usize].to_vec();
    log.extend(read_log(client, slot, retained)?);
    if log.len() < s.log.len() || log[..s.log.len()] != s.log[..] {
        let d = (0..s.log.len().min(log.len()))
            .find(|&i| log[i] != s.log[i])
            .unwrap_or(s.log.len().min(log.len()));
        return Err(format!(
            "acknowledged data lost or changed: log {} bytes, acknowledged {}, first difference at {d}",
            log.len(),
            s.log.len()
        ));
    }
    let extra = &log[s.log.len()..];
    let mut closed_may = s.closed;
    let mut closed_must = s.closed;
    match pending {
        Pending::Append {
            canonical,
            records,
            closes,
            producer,
        } => {
            if extra.is_empty() {
                outcome = "in-flight append absent".into();
            } else if extra == &canonical[..] {
                outcome = "in-flight append whole".into();
                let start_rec = s.records;
                s.extend(extra, records);
                if closes {
                    s.closed = true;
                    closed_must = true;
                }
                if let Some((seq, body)) = producer {
                    let rec = (kind_of(slot).1 == Kind::Json).then_some((start_rec, s.records));
                    s.push_receipt(Receipt {
                        seq,
                        body,
                        next: log.len() as u64,
                        rec,
                        closes,
                    });
                }
            } else {
                return Err(format!(
                    "in-flight append (len {}) is partial or wrong: {} extra bytes",
                    canonical.len(),
                    extra.len()
                ));
            }
            if closes && extra.is_empty() {
                closed_may = false;
            } else if closes {
                closed_may = true;
            }
        }
        Pending::Batch(frames) => {
            let mut pos = 0;
            let mut k = 0;
            for (c, recs) in &frames {
                if pos == extra.len() {
                    break;
                }
                if extra.len() - pos < c.len() || extra[pos..pos + c.len()] != c[..] {
                    return Err(format!(
                        "in-flight append-batch: bytes after frame {k} are not the next whole frame ({} extra bytes)",
                        extra.len()
                    ));
                }
                s.extend(&extra[pos..pos + c.len()], *recs);
                pos += c.len();
                k += 1;
            }
            if pos != extra.len() {
                return Err("in-flight append-batch: trailing bytes beyond its frames".into());
            }
            outcome = format!("in-flight batch: {k}/{} frames", frames.len());
        }
        Pending::Close => {
            closed_may = true;
            if !extra.is_empty() {
                return Err(format!(
                    "{} unexpected bytes after an in-flight close",
                    extra.len()
                ));
            }
        }
        _ => {
            if !extra.is_empty() {
                return Err(format!(
                    "{} bytes beyond everything acknowledged, nothing in flight",
                    extra.len()
                ));
            }
        }
    }
    let closed = closed_hdr(&h);
    if closed && !closed_may || !closed && closed_must {
        return Err(format!(
            "HEAD Stream-Closed {closed}, model closed {}",
            s.closed
        ));
    }
    if closed != s.closed {
        if !outcome.is_empty() {
            outcome.push_str("; ");
        }
        outcome.push_str(if closed {
            "in-flight close applied"
        } else {
            "in-flight close absent"
        });
        s.closed = closed;
    }
    if h.next_offset() != Some(log.len() as u64) {
        return Err(format!(
            "HEAD tail {:?}, read {} bytes",
            h.next_offset(),
            log.len()
        ));
    }
    if kind_of(slot).1 == Kind::Json {
        let n = records_in(&log);
        if n != s.records {
            return Err(format!("model has {} records, log has {n}", s.records));
        }
        let first = records_in(&log[..retained as usize]);
        let got = (
            hnum(&h, "stream-record-first"),
            hnum(&h, "stream-record-next"),
        );
        if got != (Some(first), Some(n)) {
            return Err(format!(
                "HEAD record First/Next {got:?}, expected ({first}, {n})"
            ));
        }
        check_records(client, rng, slot, &log, first)?;
        if first > 0 {
            let below = rng.range(0, first - 1);
            let path = format!("{path}?record={below}");
            let r = client
                .request("GET", &path, &[], &[])
                .map_err(|e| format!("GET {path}: {e}"))?;
            if r.status != 410 {
                return Err(format!(
                    "GET {path} below the first retained record {first}: {}",
                    r.status
                ));
            }
        }
    }
    if !s.receipts.is_empty() {
        let last = s.receipts.last().unwrap().clone();
        check_dedup(client, slot, s, &last)?;
        let k = rng.range(0, s.receipts.len() as u64 - 1) as usize;
        let other = s.receipts[k].clone();
        check_dedup(client, slot, s, &other)?;
    }
    if s.closed {
        let ctype = kind_of(slot).0;
        let body: &[u8] = if kind_of(slot).1 == Kind::Json {
            b"{\"late\":1}"
        } else {
            b"late"
        };
        let r = client
            .request("POST", &path, &[("Content-Type", ctype)], body)
            .map_err(|e| format!("append to closed: {e}"))?;
        if r.status != 409 || !closed_hdr(&r) {
            return Err(format!(
                "closed stream after restart accepts append: {} closed={:?}",
                r.status,
                r.header("stream-closed")
            ));
        }
    }
    let h2 = client
        .request("HEAD", &path, &[], &[])
        .map_err(|e| format!("HEAD: {e}"))?;
    if h2.next_offset() != Some(log.len() as u64) {
        return Err(format!(
            "tail moved during verification (dedup or closed append wrote data): {:?} vs {}",
            h2.next_offset(),
            log.len()
        ));
    }
    Ok(outcome)
}

/// The retention point after a restart: the acknowledged one, or the one in flight. Reads
/// before it must get `410` with `Stream-Next-Offset` at it.
fn check_retention(
    client: &mut Client,
    rng: &mut Rng,
    slot: usize,
    s: &mut Slot,
    h: &Response,
    pending: &Pending,
    outcome: &mut String,
) -> Result<u64, String> {
    let retained =
        hnum(h, "stream-retained-offset").ok_or("HEAD without Stream-Retained-Offset")?;
    match pending {
        Pending::Retain(o) if *o != s.retained => {
            if retained == *o {
                s.retained = *o;
                note(outcome, "in-flight retention applied");
            } else if retained == s.retained {
                note(outcome, "in-flight retention absent");
            }
        }
        _ => {}
    }
    if retained != s.retained {
        return Err(format!(
            "retention point {retained} after restart, acknowledged {}",
            s.retained
        ));
    }
    if retained == 0 {
        return Ok(0);
    }
    let below = rng.range(0, retained - 1);
    for offset in ["-1".to_string(), offset_token(below)] {
        let path = format!("{}?offset={offset}", path_of(slot));
        let r = client
            .request("GET", &path, &[], &[])
            .map_err(|e| format!("GET {path}: {e}"))?;
        if r.status != 410 || r.next_offset() != Some(retained) {
            return Err(format!(
                "GET {path} before the retention point {retained}: {} Stream-Next-Offset {:?}",
                r.status,
                r.next_offset()
            ));
        }
    }
    Ok(retained)
}

/// The visible snapshot after a restart must be the acknowledged one or the one in
/// flight, byte-exact; with neither there is none.
fn check_snapshot(
    client: &mut Client,
    slot: usize,
    s: &mut Slot,
    h: &Response,
    pending: &Pending,
    outcome: &mut String,
) -> Result<(), String> {
    let path = format!("{}/snapshot", path_of(slot));
    let r = client
        .request("GET", &path, &[], &[])
        .map_err(|e| format!("GET {path}: {e}"))?;
    let in_flight = match pending {
        Pending::Snapshot(p) => Some(p),
        _ => None,
    };
    let visible = match r.status {
        307 => Some(
            hnum(&r, "stream-snapshot-offset")
                .ok_or_else(|| format!("GET {path}: 307 without Stream-Snapshot-Offset"))?,
        ),
        404 => None,
        other => return Err(format!("GET {path}: {other} {}", r.body_str())),
    };
    if hnum(h, "stream-snapshot-offset") != visible {
        return Err(format!(
            "HEAD Stream-Snapshot-Offset {:?}, GET {path} says {visible:?}",
            h.header("stream-snapshot-offset")
        ));
    }
    let acked = s.snapshot.as_ref().map(|v| v.offset);
    let Some(offset) = visible else {
        if let Some(a) = acked {
            return Err(format!("the acknowledged snapshot at {a} is gone"));
        }
        if in_flight.is_some() {
            note(outcome, "in-flight snapshot absent");
        }
        return Ok(());
    };
    let want = match in_flight {
        Some(p) if p.offset == offset && acked != Some(offset) => {
            note(outcome, "in-flight snapshot applied");
            s.snapshot = Some(p.clone());
            p
        }
        _ if acked == Some(offset) => {
            if in_flight.is_some_and(|p| p.offset != offset) {
                note(outcome, "in-flight snapshot absent");
            }
            s.snapshot.as_ref().ok_or("no acknowledged snapshot")?
        }
        _ => {
            return Err(format!(
                "snapshot at {offset} visible, acknowledged {acked:?}, in flight {:?}",
                in_flight.map(|p| p.offset)
            ))
        }
    };
    let path = format!("{path}/{}", offset_token(offset));
    let r = client
        .request("GET", &path, &[], &[])
        .map_err(|e| format!("GET {path}: {e}"))?;
    if r.status != 200
        || r.body != want.blob
        || r.header("content-type") != Some(want.ctype)
        || r.next_offset() != Some(offset)
    {
        return Err(format!(
            "GET {path}: {} {} bytes of {} type {:?} Stream-Next-Offset {:?}",
            r.status,
            r.body.len(),
            want.blob.len(),
            r.header("content-type"),
            r.next_offset()
        ));
    }
    Ok(())
}

fn note(outcome: &mut String, what: &str) {
    if !outcome.is_empty() {
        outcome.push_str("; ");
    }
    outcome.push_str(what);
}

pub fn server_log_tail(path: &std::path::Path) -> String {
    let s = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

pub fn fail_with_log(log_path: &std::path::Path, msg: String) -> ! {
    panic!(
        "{msg}\n--- last server log lines ---\n{}",
        server_log_tail(log_path)
    );
}

/// (segment files, total MiB, lowest segment index, checkpoints) under the data dir.
pub fn disk_usage(dir: &std::path::Path) -> (usize, f64, u64, usize) {
    let (mut n, mut bytes, mut low, mut cps) = (0, 0u64, u64::MAX, 0);
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            if p.is_dir() {
                stack.push(p);
            } else if let Some(stem) = name.strip_suffix(".seg") {
                n += 1;
                bytes += e.metadata().map(|m| m.len()).unwrap_or(0);
                low = low.min(stem.parse().unwrap_or(u64::MAX));
            } else if name == "checkpoint" {
                cps += 1;
            }
        }
    }
    (n, bytes as f64 / (1 << 20) as f64, low, cps)
}
