//! Storage engine benchmarks on the real disk (custom harness; see `docs/benchmarks.md`).
//!
//! ```text
//! cargo bench -p ursula-benches --bench storage -- --quick            # < 2 min
//! cargo bench -p ursula-benches --bench storage -- --json out.json    # full run
//! cargo bench -p ursula-benches --bench storage -- --quick --only prealloc,recovery
//! ```
//!
//! Sections: `append` (engine, durable acks), `layout` (engine vs one file per stream),
//! `prealloc` (extend vs fallocate vs zero-filled, plain O_DIRECT), `recovery`, `read`,
//! `cold` (appends with and without eviction to a stand-in cold tier, and cold reads).
//! Everything runs in temp dirs under the system temp dir, which must be on the real disk
//! (not tmpfs): the bench refuses to run on tmpfs.

use std::cell::{Cell, RefCell};
use std::fmt::Write as _;
use std::fs::{File, OpenOptions};
use std::future::Future;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hdrhistogram::Histogram;
use ursula_storage::aligned::AlignedBuf;
use ursula_storage::cold::{ColdRead, ColdStore};
use ursula_storage::limits::IO_BLOCK_BYTES;
use ursula_storage::segment;
use ursula_storage::{
    AppendRec, Durability, Lifetime, NewStream, Offset, Shard, ShardConfig, StorageError, StreamId,
    StreamMeta,
};

type BoxError = Box<dyn std::error::Error>;
type Section = fn(&Scale, &Path) -> Result<Table, BoxError>;

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;
const GIB: u64 = 1 << 30;

// ---------------------------------------------------------------------------------------------
// Scale and arguments

struct Scale {
    name: &'static str,
    /// Seconds per closed-loop append case.
    append_secs: f64,
    /// Rounds and seconds per layout in the layout comparison.
    layout_rounds: usize,
    layout_secs: f64,
    /// Appends+fdatasyncs per preallocation mode and round.
    prealloc_ops: usize,
    prealloc_rounds: usize,
    /// Log bytes written before the recovery measurement.
    recovery_bytes: u64,
    /// Stream bytes per chunk size written before the read measurement.
    read_bytes: u64,
    /// Bytes appended per run of the cold-tier measurement.
    cold_bytes: u64,
}

const QUICK: Scale = Scale {
    name: "quick",
    append_secs: 2.5,
    layout_rounds: 3,
    layout_secs: 1.5,
    prealloc_ops: 2000,
    prealloc_rounds: 3,
    recovery_bytes: 256 << 20,
    read_bytes: 128 << 20,
    cold_bytes: GIB,
};

const FULL: Scale = Scale {
    name: "full",
    append_secs: 8.0,
    layout_rounds: 5,
    layout_secs: 4.0,
    prealloc_ops: 8000,
    prealloc_rounds: 3,
    recovery_bytes: GIB,
    read_bytes: 512 << 20,
    cold_bytes: 3 * GIB,
};

const SECTIONS: [&str; 6] = ["append", "layout", "prealloc", "recovery", "read", "cold"];

struct Args {
    scale: &'static Scale,
    json: Option<PathBuf>,
    only: Vec<String>,
}

const USAGE: &str =
    "usage: storage [--quick | --full] [--json FILE] [--only append,layout,prealloc,recovery,read,cold]";

fn parse_args() -> Result<Args, BoxError> {
    let mut args = Args {
        scale: &FULL,
        json: None,
        only: SECTIONS.iter().map(|s| s.to_string()).collect(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--quick" => args.scale = &QUICK,
            "--full" => args.scale = &FULL,
            "--json" => args.json = Some(it.next().ok_or("--json needs a file")?.into()),
            "--only" => {
                let list = it.next().ok_or("--only needs a list")?;
                args.only = list.split(',').map(|s| s.trim().to_string()).collect();
                if let Some(bad) = args.only.iter().find(|s| !SECTIONS.contains(&s.as_str())) {
                    return Err(format!("unknown section {bad:?}; {USAGE}").into());
                }
            }
            // Passed by `cargo bench` to every bench target.
            "--bench" => {}
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => eprintln!("ignoring argument {other:?}"),
        }
    }
    Ok(args)
}

// ---------------------------------------------------------------------------------------------
// Result tables (printed as Markdown, optionally dumped as JSON)

enum Val {
    Int(u64),
    F(f64, usize),
    S(String),
}

impl Val {
    fn text(&self) -> String {
        match self {
            Val::Int(v) => v.to_string(),
            Val::F(v, p) => format!("{v:.p$}"),
            Val::S(s) => s.clone(),
        }
    }

    fn json(&self) -> String {
        match self {
            Val::Int(v) => v.to_string(),
            Val::F(v, _) if v.is_finite() => format!("{v}"),
            Val::F(..) => "null".into(),
            Val::S(s) => json_str(s),
        }
    }
}

fn json_str(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

struct Table {
    id: &'static str,
    title: String,
    cols: Vec<&'static str>,
    rows: Vec<Vec<Val>>,
    notes: Vec<String>,
}

impl Table {
    fn new(id: &'static str, title: impl Into<String>, cols: &[&'static str]) -> Table {
        Table {
            id,
            title: title.into(),
            cols: cols.to_vec(),
            rows: Vec::new(),
            notes: Vec::new(),
        }
    }

    fn row(&mut self, row: Vec<Val>) {
        debug_assert_eq!(row.len(), self.cols.len());
        self.rows.push(row);
    }

    fn print(&self) {
        let cells: Vec<Vec<String>> = self
            .rows
            .iter()
            .map(|r| r.iter().map(Val::text).collect())
            .collect();
        let widths: Vec<usize> = (0..self.cols.len())
            .map(|i| {
                cells
                    .iter()
                    .map(|r| r[i].len())
                    .chain([self.cols[i].len()])
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let line = |items: &[String]| {
            let padded: Vec<String> = items
                .iter()
                .zip(&widths)
                .map(|(s, w)| format!("{s:>w$}"))
                .collect();
            format!("| {} |", padded.join(" | "))
        };
        println!("\n### {}\n", self.title);
        let head: Vec<String> = self.cols.iter().map(|s| s.to_string()).collect();
        println!("{}", line(&head));
        let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
        println!("|-{}-|", rule.join("-|-"));
        for r in &cells {
            println!("{}", line(r));
        }
        for n in &self.notes {
            println!("\n{n}");
        }
    }

    fn json(&self) -> String {
        let rows: Vec<String> = self
            .rows
            .iter()
            .map(|r| {
                let fields: Vec<String> = self
                    .cols
                    .iter()
                    .zip(r)
                    .map(|(c, v)| format!("{}: {}", json_str(c), v.json()))
                    .collect();
                format!("{{{}}}", fields.join(", "))
            })
            .collect();
        let notes: Vec<String> = self.notes.iter().map(|n| json_str(n)).collect();
        format!(
            "{{\"id\": {}, \"title\": {}, \"rows\": [\n    {}\n  ], \"notes\": [{}]}}",
            json_str(self.id),
            json_str(&self.title),
            rows.join(",\n    "),
            notes.join(", ")
        )
    }
}

// ---------------------------------------------------------------------------------------------
// Helpers

fn block_on<F: Future>(f: F) -> Result<F::Output, BoxError> {
    let mut rt = monoio::RuntimeBuilder::<monoio::FusionDriver>::new()
        .enable_timer()
        .build()?;
    Ok(rt.block_on(f))
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 600_000_000, 3).expect("valid histogram bounds")
}

/// Microseconds as milliseconds.
fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

fn mb_per_s(bytes: u64, secs: f64) -> f64 {
    bytes as f64 / 1e6 / secs
}

fn size_label(bytes: usize) -> String {
    if bytes >= MIB && bytes % MIB == 0 {
        format!("{} MiB", bytes / MIB)
    } else if bytes >= KIB && bytes % KIB == 0 {
        format!("{} KiB", bytes / KIB)
    } else {
        format!("{bytes} B")
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn temp_dir(tag: &str) -> Result<tempfile::TempDir, BoxError> {
    Ok(tempfile::Builder::new()
        .prefix(&format!("ursula-bench-{tag}-"))
        .tempdir()?)
}

/// Refuse to measure "disk" numbers on tmpfs.
fn check_not_tmpfs(dir: &Path) -> Result<(), BoxError> {
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes())?;
    // SAFETY: statfs only writes into the zeroed struct we pass; the path is NUL-terminated.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    if st.f_type == libc::TMPFS_MAGIC {
        return Err(format!(
            "{} is on tmpfs; set TMPDIR to a directory on the real disk",
            dir.display()
        )
        .into());
    }
    Ok(())
}

fn disk_config(dir: &Path, cache_bytes: usize) -> ShardConfig {
    let mut cfg = ShardConfig::new(0, Durability::Disk(dir.to_path_buf()));
    cfg.cache_bytes = cache_bytes;
    cfg
}

fn data_rec(data: Bytes) -> AppendRec {
    let len = data.len() as u32;
    AppendRec {
        append_lens: vec![len],
        msg_lens: vec![len],
        data,
        ..Default::default()
    }
}

/// Create `n` empty streams and wait until they are durable.
async fn create_streams(
    shard: &Shard,
    prefix: &str,
    n: usize,
) -> Result<Vec<StreamId>, StorageError> {
    let mut ids = Vec::with_capacity(n);
    let mut last = None;
    for i in 0..n {
        let (id, commit) = shard.create(NewStream {
            meta: StreamMeta {
                key: format!("bench/{prefix}-{i:06}").into(),
                incarnation: shard.next_incarnation(ursula_storage::now_ms()),
                created_ms: ursula_storage::now_ms(),
                content_type: "application/octet-stream".into(),
                lifetime: Lifetime::Forever,
                ext: Bytes::new(),
            },
            initial: AppendRec::default(),
        })?;
        ids.push(id);
        last = Some(commit);
    }
    if let Some(c) = last {
        c.durable().await?;
    }
    Ok(ids)
}

fn payload(len: usize, seed: u8) -> Bytes {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect::<Vec<u8>>()
        .into()
}

fn cpu_secs() -> f64 {
    // SAFETY: getrusage writes into the zeroed struct we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

// ---------------------------------------------------------------------------------------------
// 1. Engine appends with durable acks

struct AppendResult {
    ops: u64,
    bytes: u64,
    secs: f64,
    hist: Histogram<u64>,
    flushes: u64,
    records: u64,
    /// Appends refused with `Busy` (the write budget was full) and tried again.
    busy: u64,
}

impl AppendResult {
    fn per_sec(&self) -> f64 {
        self.ops as f64 / self.secs
    }
}

/// `writers` closed-loop writers, one stream each; every append waits for `durable()`. An
/// append refused because the write budget is full is tried again after 1 ms, as a client
/// does after a 503.
async fn engine_appends(
    dir: &Path,
    writers: usize,
    size: usize,
    secs: f64,
) -> Result<AppendResult, BoxError> {
    let (shard, _) = Shard::open(disk_config(dir, 64 << 20)).await?;
    let ids = create_streams(&shard, "w", writers).await?;
    let data = payload(size, 7);
    let hist = Rc::new(RefCell::new(histogram()));
    let ops = Rc::new(Cell::new(0u64));
    let busy = Rc::new(Cell::new(0u64));
    let before = shard.stats();
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(secs);
    let mut tasks = Vec::with_capacity(writers);
    for id in ids {
        let (shard, data, hist, ops) = (shard.clone(), data.clone(), hist.clone(), ops.clone());
        let busy = busy.clone();
        tasks.push(monoio::spawn(async move {
            while Instant::now() < deadline {
                let t = Instant::now();
                let commit = match shard.append(id, data_rec(data.clone())) {
                    Ok((_, commit)) => commit,
                    Err(StorageError::Busy) => {
                        busy.set(busy.get() + 1);
                        monoio::time::sleep(Duration::from_millis(1)).await;
                        continue;
                    }
                    Err(e) => return Err(e),
                };
                commit.durable().await?;
                let _ = hist
                    .borrow_mut()
                    .record(t.elapsed().as_micros().max(1) as u64);
                ops.set(ops.get() + 1);
            }
            Ok::<(), StorageError>(())
        }));
    }
    for t in tasks {
        t.await?;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let after = shard.stats();
    shard.shutdown().await?;
    let hist = hist.borrow().clone();
    Ok(AppendResult {
        ops: ops.get(),
        bytes: ops.get() * size as u64,
        secs: elapsed,
        hist,
        flushes: after.flushes - before.flushes,
        records: after.records_flushed - before.records_flushed,
        busy: busy.get(),
    })
}

fn section_append(scale: &Scale, root: &Path) -> Result<Table, BoxError> {
    let mut t = Table::new(
        "append",
        format!(
            "1. Engine append throughput, one shard, durable acks ({} s closed loop per case)",
            scale.append_secs
        ),
        &[
            "payload",
            "writers",
            "appends/s",
            "MB/s",
            "ack p50 ms",
            "ack p99 ms",
            "ack max ms",
            "commits/s",
            "appends/commit",
            "busy retries",
        ],
    );
    for &size in &[256, 4 * KIB, MIB] {
        for &writers in &[1, 16, 256] {
            let dir = tempfile::Builder::new()
                .prefix("ursula-bench-append-")
                .tempdir_in(root)?;
            let r = block_on(engine_appends(dir.path(), writers, size, scale.append_secs))??;
            eprintln!(
                "  append {} x{writers}: {:.0}/s",
                size_label(size),
                r.per_sec()
            );
            t.row(vec![
                Val::S(size_label(size)),
                Val::Int(writers as u64),
                Val::F(r.per_sec(), 0),
                Val::F(mb_per_s(r.bytes, r.secs), 1),
                Val::F(ms(r.hist.value_at_quantile(0.5)), 2),
                Val::F(ms(r.hist.value_at_quantile(0.99)), 2),
                Val::F(ms(r.hist.max()), 1),
                Val::F(r.flushes as f64 / r.secs, 0),
                Val::F(r.records as f64 / r.flushes.max(1) as f64, 1),
                Val::Int(r.busy),
            ]);
        }
    }
    t.notes.push(
        "MB/s counts payload bytes (10^6 B). appends/commit = records_flushed / flushes from \
         Shard::stats() (a commit is one O_DSYNC write per segment touched). Busy retries: \
         appends refused while the write budget was full, tried again 1 ms later."
            .into(),
    );
    Ok(t)
}

// ---------------------------------------------------------------------------------------------
// 2. Layout: one shared log vs one O_DIRECT file per stream

/// `writers` closed-loop writers, each appending `size` bytes to its own O_DIRECT file:
/// rewrite the 4 KiB block holding the new bytes, then fdatasync that file.
async fn per_file_appends(
    dir: &Path,
    writers: usize,
    size: usize,
    secs: f64,
) -> Result<AppendResult, BoxError> {
    assert!(
        size <= IO_BLOCK_BYTES && IO_BLOCK_BYTES % size == 0,
        "payload must divide a block"
    );
    let hist = Rc::new(RefCell::new(histogram()));
    let ops = Rc::new(Cell::new(0u64));
    let mut files = Vec::with_capacity(writers);
    for i in 0..writers {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .custom_flags(libc::O_DIRECT)
            .open(dir.join(format!("stream-{i:06}.dat")))?;
        files.push(monoio::fs::File::from_std(f)?);
    }
    File::open(dir)?.sync_all()?;
    let data = payload(size, 9);
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(secs);
    let mut tasks = Vec::with_capacity(writers);
    for file in files {
        let (data, hist, ops) = (data.clone(), hist.clone(), ops.clone());
        tasks.push(monoio::spawn(async move {
            let mut buf = AlignedBuf::with_capacity(IO_BLOCK_BYTES);
            buf.set_len(IO_BLOCK_BYTES);
            let mut tail = 0u64;
            while Instant::now() < deadline {
                let t = Instant::now();
                let at = (tail % IO_BLOCK_BYTES as u64) as usize;
                buf.as_mut_full()[at..at + size].copy_from_slice(&data);
                let (res, b) = file.write_all_at(buf, tail - at as u64).await;
                buf = b;
                res?;
                file.sync_data().await?;
                tail += size as u64;
                if tail % IO_BLOCK_BYTES as u64 == 0 {
                    buf.as_mut_full().fill(0);
                }
                let _ = hist
                    .borrow_mut()
                    .record(t.elapsed().as_micros().max(1) as u64);
                ops.set(ops.get() + 1);
            }
            Ok::<(), std::io::Error>(())
        }));
    }
    for t in tasks {
        t.await?;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let hist = hist.borrow().clone();
    Ok(AppendResult {
        ops: ops.get(),
        bytes: ops.get() * size as u64,
        secs: elapsed,
        hist,
        flushes: ops.get(),
        records: ops.get(),
        busy: 0,
    })
}

fn section_layout(scale: &Scale, root: &Path) -> Result<Table, BoxError> {
    let rounds = scale.layout_rounds;
    let secs = scale.layout_secs;
    let mut t = Table::new(
        "layout",
        format!(
            "2. Layout: shared log + group commit vs one O_DIRECT file per stream \
             (256 B appends, {rounds} alternating rounds of {secs} s per layout)"
        ),
        &[
            "writers",
            "layout",
            "appends/s (median)",
            "ack p50 ms",
            "ack p99 ms",
            "fdatasyncs/s (median)",
            "engine / per-file (median of rounds)",
            "per-round ratios",
        ],
    );
    let size = 256;
    for &writers in &[16, 256] {
        // Per layout: merged histogram, appends/s and fdatasyncs/s per round.
        let mut acc: Vec<(Histogram<u64>, Vec<f64>, Vec<f64>)> = (0..2)
            .map(|_| (histogram(), Vec::new(), Vec::new()))
            .collect();
        let mut ratios = Vec::new();
        for round in 0..rounds {
            let mut rates = [0.0; 2];
            // ABBA order so neither layout always runs first.
            let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
            for which in order {
                let dir = tempfile::Builder::new()
                    .prefix("ursula-bench-layout-")
                    .tempdir_in(root)?;
                let r = if which == 0 {
                    block_on(engine_appends(dir.path(), writers, size, secs))??
                } else {
                    block_on(per_file_appends(dir.path(), writers, size, secs))??
                };
                acc[which].0.add(&r.hist)?;
                acc[which].1.push(r.per_sec());
                acc[which].2.push(r.flushes as f64 / r.secs);
                rates[which] = r.per_sec();
            }
            eprintln!(
                "  layout x{writers} round {round}: engine {:.0}/s, per-file {:.0}/s",
                rates[0], rates[1]
            );
            ratios.push(rates[0] / rates[1]);
        }
        let ratio_list: Vec<String> = ratios.iter().map(|r| format!("{r:.1}")).collect();
        let ratio = median(&mut ratios);
        for (which, name) in ["shared log (engine)", "file per stream"]
            .iter()
            .enumerate()
        {
            let (hist, rates, syncs) = &mut acc[which];
            t.row(vec![
                Val::Int(writers as u64),
                Val::S(name.to_string()),
                Val::F(median(rates), 0),
                Val::F(ms(hist.value_at_quantile(0.5)), 2),
                Val::F(ms(hist.value_at_quantile(0.99)), 2),
                Val::F(median(syncs), 0),
                if which == 0 {
                    Val::F(ratio, 1)
                } else {
                    Val::S(String::new())
                },
                if which == 0 {
                    Val::S(ratio_list.join(", "))
                } else {
                    Val::S(String::new())
                },
            ]);
        }
    }
    t.notes.push(
        "Per-file baseline: each append rewrites the file's last 4 KiB block (O_DIRECT, \
         file grows by 4 KiB every 16 appends) and fdatasyncs that file; all writers run \
         concurrently on one monoio thread (io_uring), so up to N fdatasyncs are in flight. \
         The engine has one flush (write + fdatasync) in flight at a time."
            .into(),
    );
    Ok(t)
}

// ---------------------------------------------------------------------------------------------
// 3. Preallocation (plain std + libc, synchronous)

#[derive(Clone, Copy, PartialEq)]
enum Prealloc {
    Extend,
    Fallocate,
    Zeroed,
}

impl Prealloc {
    fn label(self) -> &'static str {
        match self {
            Prealloc::Extend => "(a) extend on every write",
            Prealloc::Fallocate => "(b) fallocate (unwritten extents, as a new segment)",
            Prealloc::Zeroed => "(c) zero-filled preallocated",
        }
    }
}

fn open_direct_new(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
}

/// Returns (fdatasync latencies µs, write+fdatasync latencies µs, ops/s).
fn prealloc_case(
    dir: &Path,
    mode: Prealloc,
    ops: usize,
) -> Result<(Histogram<u64>, Histogram<u64>, f64), BoxError> {
    let path = dir.join("prealloc.dat");
    let file = open_direct_new(&path)?;
    let size = (ops * IO_BLOCK_BYTES) as u64;
    match mode {
        Prealloc::Extend => {}
        Prealloc::Fallocate => {
            // SAFETY: valid fd; fallocate reads only its scalar arguments.
            if unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, size as libc::off_t) } != 0 {
                return Err(std::io::Error::last_os_error().into());
            }
        }
        Prealloc::Zeroed => {
            let mut zeros = AlignedBuf::with_capacity(MIB);
            zeros.set_len(MIB);
            let mut pos = 0u64;
            while pos < size {
                let n = (size - pos).min(MIB as u64) as usize;
                file.write_all_at(&zeros.as_slice()[..n], pos)?;
                pos += n as u64;
            }
        }
    }
    file.sync_all()?;
    File::open(dir)?.sync_all()?;
    let mut block = AlignedBuf::with_capacity(IO_BLOCK_BYTES);
    block.set_len(IO_BLOCK_BYTES);
    let (mut sync_h, mut op_h) = (histogram(), histogram());
    let started = Instant::now();
    for i in 0..ops {
        block.as_mut_full()[..8].copy_from_slice(&(i as u64).to_le_bytes());
        let t0 = Instant::now();
        file.write_all_at(block.as_slice(), (i * IO_BLOCK_BYTES) as u64)?;
        let t1 = Instant::now();
        file.sync_data()?;
        let done = t1.elapsed().as_micros().max(1) as u64;
        let _ = sync_h.record(done);
        let _ = op_h.record(t0.elapsed().as_micros().max(1) as u64);
    }
    let rate = ops as f64 / started.elapsed().as_secs_f64();
    drop(file);
    std::fs::remove_file(&path)?;
    Ok((sync_h, op_h, rate))
}

fn section_prealloc(scale: &Scale, root: &Path) -> Result<Table, BoxError> {
    let mut t = Table::new(
        "prealloc",
        format!(
            "3. Preallocation: 4 KiB O_DIRECT append + fdatasync, {} ops x {} interleaved rounds per mode",
            scale.prealloc_ops, scale.prealloc_rounds
        ),
        &[
            "file",
            "fdatasync p50 ms",
            "fdatasync p99 ms",
            "write+sync p50 ms",
            "appends+fdatasync/s (median round)",
            "rounds /s",
            "vs (b)",
        ],
    );
    let modes = [Prealloc::Extend, Prealloc::Fallocate, Prealloc::Zeroed];
    let mut acc: Vec<(Histogram<u64>, Histogram<u64>, Vec<f64>)> = modes
        .iter()
        .map(|_| (histogram(), histogram(), Vec::new()))
        .collect();
    let dir = tempfile::Builder::new()
        .prefix("ursula-bench-prealloc-")
        .tempdir_in(root)?;
    for round in 0..scale.prealloc_rounds {
        for (i, &mode) in modes.iter().enumerate() {
            let (s, o, rate) = prealloc_case(dir.path(), mode, scale.prealloc_ops)?;
            eprintln!("  prealloc round {round} {}: {rate:.0}/s", mode.label());
            acc[i].0.add(&s)?;
            acc[i].1.add(&o)?;
            acc[i].2.push(rate);
        }
    }
    let medians: Vec<f64> = acc.iter().map(|a| median(&mut a.2.clone())).collect();
    let base = medians[1];
    for (i, &mode) in modes.iter().enumerate() {
        let (s, o, rates) = &acc[i];
        let rounds: Vec<String> = rates.iter().map(|r| format!("{r:.0}")).collect();
        t.row(vec![
            Val::S(mode.label().into()),
            Val::F(ms(s.value_at_quantile(0.5)), 2),
            Val::F(ms(s.value_at_quantile(0.99)), 2),
            Val::F(ms(o.value_at_quantile(0.5)), 2),
            Val::F(medians[i], 0),
            Val::S(rounds.join(", ")),
            Val::F(medians[i] / base, 2),
        ]);
    }
    t.notes.push(
        "Plain std/libc, one thread, QD1: pwrite(O_DIRECT, 4 KiB at the next offset) then \
         fdatasync. (c) is written with zeros and fsynced before timing starts."
            .into(),
    );
    Ok(t)
}

// ---------------------------------------------------------------------------------------------
// 4. Recovery

struct RecoveryResult {
    write_secs: f64,
    written: u64,
    checkpoint_bytes: u64,
    report: ursula_storage::RecoveryReport,
}

/// How the shard stops before the measured reopen.
#[derive(Clone, Copy)]
enum Restart {
    /// No checkpoint at all: the whole log is replayed.
    FullReplay,
    /// A checkpoint `tail` bytes before the end, then a crash-like stop: the worst case a
    /// `checkpoint_bytes` setting of `tail` allows.
    CheckpointThenCrash { tail: u64 },
    /// A clean shutdown, which checkpoints at the head.
    Clean,
}

impl Restart {
    fn label(self) -> String {
        match self {
            Restart::FullReplay => "full replay".into(),
            Restart::CheckpointThenCrash { tail } => {
                format!("checkpoint + {} MiB", tail / MIB as u64)
            }
            Restart::Clean => "clean shutdown".into(),
        }
    }
}

async fn recovery_run(
    dir: &Path,
    total: u64,
    size: usize,
    (streams, writers): (usize, usize),
    restart: Restart,
) -> Result<RecoveryResult, BoxError> {
    let mut cfg = disk_config(dir, 64 << 20);
    cfg.checkpoint_bytes = u64::MAX; // checkpoints only where this benchmark takes them
    let checkpoint_at = match restart {
        Restart::CheckpointThenCrash { tail } => total.saturating_sub(tail),
        _ => u64::MAX,
    };
    let written = {
        let (shard, _) = Shard::open(cfg.clone()).await?;
        let ids = Rc::new(create_streams(&shard, "r", streams).await?);
        let data = payload(size, 3);
        let written = Rc::new(Cell::new(0u64));
        let started = Instant::now();
        let mut tasks = Vec::new();
        for w in 0..writers {
            let (shard, ids, data, written) =
                (shard.clone(), ids.clone(), data.clone(), written.clone());
            tasks.push(monoio::spawn(async move {
                let mut i = w;
                while written.get() < checkpoint_at.min(total) {
                    written.set(written.get() + data.len() as u64);
                    let (_, c) = shard.append(ids[i % ids.len()], data_rec(data.clone()))?;
                    c.durable().await?;
                    i += writers;
                }
                Ok::<(), StorageError>(())
            }));
        }
        for t in tasks {
            t.await?;
        }
        if checkpoint_at < total {
            shard.checkpoint().await?;
            let data = payload(size, 4);
            let mut i = 0;
            while written.get() < total {
                let mut commits = Vec::new();
                for _ in 0..writers {
                    written.set(written.get() + data.len() as u64);
                    commits.push(shard.append(ids[i % ids.len()], data_rec(data.clone()))?.1);
                    i += 1;
                }
                for c in commits {
                    c.durable().await?;
                }
            }
        }
        match restart {
            Restart::Clean => shard.shutdown().await?,
            _ => shard.halt().await?,
        }
        (started.elapsed().as_secs_f64(), written.get())
    };
    let checkpoint_bytes = std::fs::metadata(dir.join("shard-0").join("checkpoint"))
        .map(|m| m.len())
        .unwrap_or(0);
    let (shard, report) = Shard::open(cfg).await?;
    shard.halt().await?;
    Ok(RecoveryResult {
        write_secs: written.0,
        written: written.1,
        checkpoint_bytes,
        report,
    })
}

fn section_recovery(scale: &Scale, root: &Path) -> Result<Table, BoxError> {
    let mut t = Table::new(
        "recovery",
        "4. Recovery: Shard::open after a crash-like stop or a clean shutdown",
        &[
            "record payload",
            "streams",
            "restart",
            "written MiB",
            "write MB/s",
            "checkpoint KiB",
            "records replayed",
            "log MiB replayed",
            "recovery s",
            "s per GiB written",
        ],
    );
    let restarts = [
        Restart::FullReplay,
        Restart::CheckpointThenCrash {
            tail: ursula_storage::shard::DEFAULT_CHECKPOINT_BYTES,
        },
        Restart::Clean,
    ];
    for &(size, streams, writers) in &[(4 * KIB, 1024, 256), (64 * KIB, 256, 64)] {
        for restart in restarts {
            let dir = tempfile::Builder::new()
                .prefix("ursula-bench-recovery-")
                .tempdir_in(root)?;
            let r = block_on(recovery_run(
                dir.path(),
                scale.recovery_bytes,
                size,
                (streams, writers),
                restart,
            ))??;
            let rep = &r.report;
            let secs = rep.elapsed.as_secs_f64();
            eprintln!(
                "  recovery {} {}: {} records in {secs:.2} s",
                size_label(size),
                restart.label(),
                rep.records
            );
            t.row(vec![
                Val::S(size_label(size)),
                Val::Int(streams as u64),
                Val::S(restart.label()),
                Val::F(r.written as f64 / MIB as f64, 0),
                Val::F(mb_per_s(r.written, r.write_secs), 1),
                Val::F(r.checkpoint_bytes as f64 / KIB as f64, 0),
                Val::Int(rep.records),
                Val::F(rep.log_bytes as f64 / MIB as f64, 0),
                Val::F(secs, 2),
                Val::F(secs / (r.written as f64 / GIB as f64), 2),
            ]);
            if rep.dropped_bytes != 0 || rep.orphan_segments != 0 {
                t.notes.push(format!(
                    "UNEXPECTED ({} {}): dropped_bytes={} orphan_segments={}",
                    size_label(size),
                    restart.label(),
                    rep.dropped_bytes,
                    rep.orphan_segments
                ));
            }
        }
    }
    t.notes.push(
        "Written by closed-loop writers (fsync'd acks) spread over the streams; the shard is \
         stopped, dropped and reopened with Shard::open in the same process. 'full replay' \
         has no checkpoint; 'checkpoint + N MiB' checkpoints N MiB before the end and stops \
         like a crash (the most a restart replays with checkpoint_bytes = N); 'clean \
         shutdown' checkpoints at the head. Segment reads use O_DIRECT, so the guest page \
         cache does not help; the host's may."
            .into(),
    );
    Ok(t)
}

// ---------------------------------------------------------------------------------------------
// 5. Reads

struct ReadRow {
    source: &'static str,
    chunk: usize,
    range: usize,
    bytes: u64,
    secs: f64,
}

async fn read_ranges(
    shard: &Shard,
    ids: &[StreamId],
    range: usize,
    min_secs: f64,
) -> Result<(u64, f64), BoxError> {
    let started = Instant::now();
    let mut bytes = 0u64;
    // Copy every range out, as a response body would be, so memory reads cost something.
    let mut out = Vec::with_capacity(range);
    loop {
        for &id in ids {
            let tail = shard.stream(id).map_or(Offset::ZERO, |s| s.next_offset());
            let mut from = Offset::ZERO;
            while from < tail {
                let pieces = shard.read(id, from, from + range as u64).await?;
                out.clear();
                for p in &pieces {
                    out.extend_from_slice(p);
                }
                let n = out.len();
                if n == 0 {
                    return Err(format!("read of stream {id} at {from} returned nothing").into());
                }
                bytes += n as u64;
                from += n as u64;
            }
        }
        if started.elapsed().as_secs_f64() >= min_secs {
            break;
        }
    }
    Ok((bytes, started.elapsed().as_secs_f64()))
}

async fn read_run(dir: &Path, per_chunk_bytes: u64) -> Result<Vec<ReadRow>, BoxError> {
    const CHUNKS: [usize; 2] = [64 * KIB, MIB];
    const RANGES: [usize; 2] = [MIB, 8 * MIB];
    const STREAMS_PER_CHUNK: usize = 4;
    let mut rows = Vec::new();
    let mut groups: Vec<(usize, Vec<StreamId>)> = Vec::new();
    {
        let (shard, _) = Shard::open(disk_config(dir, 8 << 30)).await?;
        for &chunk in &CHUNKS {
            let ids = create_streams(&shard, &format!("c{chunk}"), STREAMS_PER_CHUNK).await?;
            let data = payload(chunk, 5);
            let per_stream = per_chunk_bytes / STREAMS_PER_CHUNK as u64;
            let writers = (32 * MIB / chunk).clamp(4, 64);
            let mut tasks = Vec::new();
            for w in 0..writers {
                let (shard, data) = (shard.clone(), data.clone());
                let id = ids[w % ids.len()];
                tasks.push(monoio::spawn(async move {
                    while shard.head(id).map_or(u64::MAX, |s| s.tail().get()) < per_stream {
                        // A buffer of its own per append, so cached reads touch real memory.
                        let own = Bytes::copy_from_slice(&data);
                        let (_, c) = shard.append(id, data_rec(own))?;
                        c.durable().await?;
                    }
                    Ok::<(), StorageError>(())
                }));
            }
            for t in tasks {
                t.await?;
            }
            groups.push((chunk, ids));
        }
        for (chunk, ids) in &groups {
            for &range in &RANGES {
                let (bytes, secs) = read_ranges(&shard, ids, range, 1.0).await?;
                rows.push(ReadRow {
                    source: "memory (cache_bytes 8 GiB)",
                    chunk: *chunk,
                    range,
                    bytes,
                    secs,
                });
            }
        }
        shard.shutdown().await?;
    }
    // Reopen with no cache: every read goes to the log with O_DIRECT.
    let (shard, _) = Shard::open(disk_config(dir, 0)).await?;
    for (chunk, ids) in &groups {
        for &range in &RANGES {
            let (bytes, secs) = read_ranges(&shard, ids, range, 0.0).await?;
            rows.push(ReadRow {
                source: "disk (reopened, cache_bytes 0)",
                chunk: *chunk,
                range,
                bytes,
                secs,
            });
        }
    }
    shard.shutdown().await?;
    Ok(rows)
}

fn section_read(scale: &Scale, root: &Path) -> Result<Table, BoxError> {
    let mut t = Table::new(
        "read",
        format!(
            "5. Reads with Shard::read, sequential ranges, {} MiB per chunk size over 4 streams",
            scale.read_bytes >> 20
        ),
        &[
            "source",
            "append (chunk) size",
            "range",
            "read MiB",
            "MB/s",
            "ranges/s",
        ],
    );
    let dir = tempfile::Builder::new()
        .prefix("ursula-bench-read-")
        .tempdir_in(root)?;
    let rows = block_on(read_run(dir.path(), scale.read_bytes))??;
    for r in rows {
        eprintln!(
            "  read {} {} / {}: {:.0} MB/s",
            r.source,
            size_label(r.chunk),
            size_label(r.range),
            mb_per_s(r.bytes, r.secs)
        );
        t.row(vec![
            Val::S(r.source.into()),
            Val::S(size_label(r.chunk)),
            Val::S(size_label(r.range)),
            Val::F(r.bytes as f64 / MIB as f64, 0),
            Val::F(mb_per_s(r.bytes, r.secs), 0),
            Val::F(r.bytes as f64 / r.range as f64 / r.secs, 0),
        ]);
    }
    t.notes.push(
        "Every range returned by Shard::read (zero-copy Bytes slices) is copied once into a \
         reused buffer, standing in for the response body; without that copy memory reads \
         only measure a HashMap lookup and a slice. Memory: at least 1 s of passes over the \
         data. Disk: one pass per range size; reads load one record per chunk with a \
         QD1 O_DIRECT read, CRC-check it, then evict it again (cache_bytes 0)."
            .into(),
    );
    Ok(t)
}

// ---------------------------------------------------------------------------------------------
// 6. The cold tier: eviction beside appends, and reads of evicted segments

/// A cold tier in a local directory, standing in for S3: each request waits a fixed delay
/// (S3's time to first byte), then reads its range of the copied segment (in the page
/// cache: the copy was just written, so this measures the engine, not a disk).
#[derive(Debug)]
struct DirColdStore {
    dir: PathBuf,
    /// Delay per request, in microseconds.
    latency_us: AtomicU64,
}

impl ColdStore for DirColdStore {
    fn is_archived(&self, _shard: u32, segment: ursula_storage::SegmentNo) -> bool {
        segment::segment_path(&self.dir, segment).exists()
    }

    fn read(
        &self,
        _shard: u32,
        segment: ursula_storage::SegmentNo,
        offset: u64,
        len: usize,
    ) -> ColdRead {
        let path = segment::segment_path(&self.dir, segment);
        let latency = Duration::from_micros(self.latency_us.load(Ordering::Relaxed));
        Box::pin(async move {
            if !latency.is_zero() {
                monoio::time::sleep(latency).await;
            }
            segment::read_up_to(&path, offset, len).map(Bytes::from)
        })
    }
}

/// Copy the sealed segments of `shard_dir` (every file but the newest) not yet in `store`,
/// as the archiver would; returns how many.
fn archive_sealed(shard_dir: &Path, store: &Path) -> std::io::Result<usize> {
    let mut segs = segment::list_segments(shard_dir)?;
    segs.pop();
    let mut copied = 0;
    for seg in segs {
        let to = segment::segment_path(store, seg);
        if to.exists() {
            continue;
        }
        let tmp = to.with_extension("tmp");
        match std::fs::copy(segment::segment_path(shard_dir, seg), &tmp) {
            Ok(_) => std::fs::rename(&tmp, &to)?,
            // Evicted meanwhile (only archived ones are), or cleaned.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        }
        copied += 1;
    }
    Ok(copied)
}

/// The archiver's disk traffic without S3: a thread copying sealed segments every 50 ms.
fn spawn_archiver(
    shard_dir: PathBuf,
    store: PathBuf,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<std::io::Result<usize>> {
    std::thread::spawn(move || {
        let mut copied = 0;
        while !stop.load(Ordering::Relaxed) {
            copied += archive_sealed(&shard_dir, &store)?;
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(copied)
    })
}

const COLD_STREAMS: usize = 16;
const COLD_APPEND: usize = 64 * KIB;
const COLD_WRITERS: usize = 64;

fn cold_config(dir: &Path, store: &Arc<DirColdStore>, local_bytes: Option<u64>) -> ShardConfig {
    let mut cfg = disk_config(dir, 0);
    cfg.segment_bytes = 0; // the minimum, so a run rolls and evicts many times
    cfg.cold = Some(store.clone());
    cfg.local_bytes = local_bytes;
    cfg
}

struct ColdWrite {
    bytes: u64,
    secs: f64,
    hist: Histogram<u64>,
    cpu_secs: f64,
    evicted: u64,
    unarchived: usize,
    max_local: u64,
    segment_bytes: u64,
}

/// Closed-loop 64 KiB appends over 16 streams until `bytes` are written, with the archiver
/// copying sealed segments; the shard evicts them if it has a local budget.
async fn cold_write(
    dir: &Path,
    store: &Arc<DirColdStore>,
    local_bytes: Option<u64>,
    bytes: u64,
) -> Result<ColdWrite, BoxError> {
    let (shard, _) = Shard::open(cold_config(dir, store, local_bytes)).await?;
    let ids = create_streams(&shard, "cold", COLD_STREAMS).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let archiver = spawn_archiver(dir.join("shard-0"), store.dir.clone(), stop.clone());
    let data = payload(COLD_APPEND, 9);
    let hist = Rc::new(RefCell::new(histogram()));
    let written = Rc::new(Cell::new(0u64));
    let max_local = Rc::new(Cell::new(0u64));
    let (t0, c0) = (Instant::now(), cpu_secs());
    let mut tasks = Vec::new();
    for w in 0..COLD_WRITERS {
        let (shard, data, hist, written, max_local) = (
            shard.clone(),
            data.clone(),
            hist.clone(),
            written.clone(),
            max_local.clone(),
        );
        let id = ids[w % ids.len()];
        tasks.push(monoio::spawn(async move {
            while written.get() < bytes {
                let t = Instant::now();
                let (_, c) = shard.append(id, data_rec(data.clone()))?;
                c.durable().await?;
                let _ = hist
                    .borrow_mut()
                    .record(t.elapsed().as_micros().max(1) as u64);
                written.set(written.get() + data.len() as u64);
                max_local.set(max_local.get().max(shard.stats().local_segment_bytes));
            }
            Ok::<(), StorageError>(())
        }));
    }
    for t in tasks {
        t.await?;
    }
    let (secs, cpu) = (t0.elapsed().as_secs_f64(), cpu_secs() - c0);
    let stats = shard.stats();
    let segment_bytes = shard.disk_usage().segment_bytes / shard.disk_usage().segments as u64;
    // Sealed segments the stand-in archiver had not copied yet when the writers finished:
    // they cannot leave, so they are what keeps the local files over the budget.
    let mut sealed = segment::list_segments(&dir.join("shard-0"))?;
    sealed.pop();
    let unarchived = sealed
        .iter()
        .filter(|&&s| !segment::segment_path(&store.dir, s).exists())
        .count();
    shard.shutdown().await?;
    stop.store(true, Ordering::Relaxed);
    archiver.join().map_err(|_| "archiver panicked")??;
    let hist = hist.borrow().clone();
    Ok(ColdWrite {
        bytes: written.get(),
        secs,
        hist,
        cpu_secs: cpu,
        evicted: stats.evicted_segments,
        unarchived,
        max_local: max_local.get(),
        segment_bytes,
    })
}

struct ColdReadRow {
    source: String,
    readers: usize,
    bytes: u64,
    secs: f64,
    hist: Histogram<u64>,
    cpu_secs: f64,
    fetched: u64,
    fetches: u64,
}

/// `readers` streams read at once, each from offset 0 in 1 MiB ranges to its tail (or its
/// first `limit` bytes); every range read's latency is recorded.
async fn cold_reads(
    shard: &Shard,
    readers: usize,
    limit: u64,
    source: String,
) -> Result<ColdReadRow, BoxError> {
    let before = shard.stats();
    let hist = Rc::new(RefCell::new(histogram()));
    let (t0, c0) = (Instant::now(), cpu_secs());
    let mut tasks = Vec::new();
    for r in 0..readers {
        let (shard, hist) = (shard.clone(), hist.clone());
        let key = format!("bench/cold-{r:06}");
        tasks.push(monoio::spawn(async move {
            let id = shard.lookup(&key).ok_or("stream missing")?;
            let tail = shard
                .stream(id)
                .map_or(Offset::ZERO, |s| s.next_offset())
                .min(Offset::ZERO + limit);
            let (mut from, mut bytes) = (Offset::ZERO, 0u64);
            let mut out = Vec::with_capacity(MIB);
            while from < tail {
                let t = Instant::now();
                let pieces = shard.read(id, from, (from + MIB as u64).min(tail)).await?;
                out.clear();
                for p in &pieces {
                    out.extend_from_slice(p);
                }
                let _ = hist
                    .borrow_mut()
                    .record(t.elapsed().as_micros().max(1) as u64);
                if out.is_empty() {
                    return Err(format!("read of {key} at {from} returned nothing").into());
                }
                from += out.len() as u64;
                bytes += out.len() as u64;
            }
            Ok::<u64, BoxError>(bytes)
        }));
    }
    let mut bytes = 0;
    for t in tasks {
        bytes += t.await?;
    }
    let (secs, cpu) = (t0.elapsed().as_secs_f64(), cpu_secs() - c0);
    let after = shard.stats();
    let hist = hist.borrow().clone();
    Ok(ColdReadRow {
        source,
        readers,
        bytes,
        secs,
        hist,
        cpu_secs: cpu,
        fetched: after.cold_read_bytes - before.cold_read_bytes,
        fetches: after.cold_reads - before.cold_reads,
    })
}

fn section_cold(scale: &Scale, root: &Path) -> Result<Table, BoxError> {
    let mut t = Table::new(
        "cold",
        format!(
            "6. Cold tier: {} MiB of 64 KiB appends over {COLD_STREAMS} streams per run, then \
             reads in 1 MiB ranges",
            scale.cold_bytes >> 20
        ),
        &[
            "case",
            "readers",
            "MiB",
            "MB/s",
            "p50 ms",
            "p99 ms",
            "CPU us/MiB",
            "evicted / fetched MiB",
        ],
    );
    // Appends with and without eviction, alternating, each in a fresh data dir; the last
    // of each is kept for the reads.
    let mut kept: Vec<(bool, tempfile::TempDir, Arc<DirColdStore>)> = Vec::new();
    let mut segment_bytes = 0;
    for round in 0..2 {
        for evict in [false, true] {
            let dir = tempfile::Builder::new()
                .prefix("ursula-bench-cold-")
                .tempdir_in(root)?;
            let store = Arc::new(DirColdStore {
                dir: dir.path().join("cold"),
                latency_us: AtomicU64::new(0),
            });
            std::fs::create_dir_all(&store.dir)?;
            let data = dir.path().join("data");
            // Two segments' worth once the first run has shown the segment size.
            let budget = evict.then_some(2 * segment_bytes.max(64 << 20));
            let w = block_on(cold_write(&data, &store, budget, scale.cold_bytes))??;
            segment_bytes = w.segment_bytes;
            let label = match budget {
                Some(b) => format!("append, local_bytes {} MiB (evicting)", b >> 20),
                None => "append, no local budget".to_string(),
            };
            eprintln!(
                "  cold {label} round {round}: {:.0} MB/s",
                mb_per_s(w.bytes, w.secs)
            );
            t.row(vec![
                Val::S(format!("{label}, round {}", round + 1)),
                Val::Int(COLD_WRITERS as u64),
                Val::F(w.bytes as f64 / MIB as f64, 0),
                Val::F(mb_per_s(w.bytes, w.secs), 0),
                Val::F(ms(w.hist.value_at_quantile(0.5)), 2),
                Val::F(ms(w.hist.value_at_quantile(0.99)), 2),
                Val::F(w.cpu_secs * 1e6 / (w.bytes as f64 / MIB as f64), 0),
                Val::S(if evict {
                    format!(
                        "{} segments; local files peaked at {} MiB; {} unarchived at the end",
                        w.evicted,
                        w.max_local >> 20,
                        w.unarchived
                    )
                } else {
                    "-".into()
                }),
            ]);
            if round == 1 {
                kept.push((evict, dir, store));
            }
        }
    }
    let mut rows = Vec::new();
    for (evict, dir, store) in &kept {
        let data = dir.path().join("data");
        if !evict {
            // Local data: from memory (the second of two passes with a large cache), and
            // from the disk (cache_bytes 0, so every range is read with O_DIRECT).
            block_on(async {
                let mut cfg = cold_config(&data, store, None);
                cfg.cache_bytes = 4 << 30;
                let (shard, _) = Shard::open(cfg).await?;
                cold_reads(&shard, COLD_STREAMS, u64::MAX, "warm-up".into()).await?;
                rows.push(cold_reads(&shard, 1, u64::MAX, "memory (stream cache)".into()).await?);
                rows.push(
                    cold_reads(
                        &shard,
                        COLD_STREAMS,
                        u64::MAX,
                        "memory (stream cache)".into(),
                    )
                    .await?,
                );
                shard.shutdown().await?;
                let (shard, _) = Shard::open(cold_config(&data, store, None)).await?;
                rows.push(cold_reads(&shard, 1, u64::MAX, "local disk".into()).await?);
                rows.push(cold_reads(&shard, COLD_STREAMS, u64::MAX, "local disk".into()).await?);
                shard.shutdown().await?;
                Ok::<(), BoxError>(())
            })??;
            continue;
        }
        // Everything sealed goes cold: archive it all, then a budget of nothing.
        archive_sealed(&data.join("shard-0"), &store.dir)?;
        for latency_ms in [0u64, 20] {
            store.latency_us.store(latency_ms * 1000, Ordering::Relaxed);
            block_on(async {
                let (shard, _) = Shard::open(cold_config(&data, store, Some(0))).await?;
                shard.evict_archived().await?;
                let cold = shard.stats().cold_segments;
                let label = |what: &str| format!("cold, {latency_ms} ms/request{what}");
                rows.push(cold_reads(&shard, 1, u64::MAX, label("")).await?);
                rows.push(cold_reads(&shard, COLD_STREAMS, u64::MAX, label("")).await?);
                // The first 512 KiB of each stream twice: the second pass hits the cold
                // cache (their blocks, and those read ahead, fit in its 64 MiB).
                let hot = 512 * KIB as u64;
                cold_reads(&shard, COLD_STREAMS, hot, "fill".into()).await?;
                rows.push(
                    cold_reads(
                        &shard,
                        COLD_STREAMS,
                        hot,
                        label(", again from the cold cache"),
                    )
                    .await?,
                );
                eprintln!("  cold reads at {latency_ms} ms: {cold} cold segments");
                shard.shutdown().await?;
                Ok::<(), BoxError>(())
            })??;
        }
    }
    for r in rows {
        eprintln!(
            "  read {} x{}: {:.0} MB/s",
            r.source,
            r.readers,
            mb_per_s(r.bytes, r.secs)
        );
        t.row(vec![
            Val::S(r.source.clone()),
            Val::Int(r.readers as u64),
            Val::F(r.bytes as f64 / MIB as f64, 0),
            Val::F(mb_per_s(r.bytes, r.secs), 0),
            Val::F(ms(r.hist.value_at_quantile(0.5)), 2),
            Val::F(ms(r.hist.value_at_quantile(0.99)), 2),
            Val::F(r.cpu_secs * 1e6 / (r.bytes as f64 / MIB as f64), 0),
            Val::S(if r.fetches > 0 {
                format!("{} MiB in {} fetches", r.fetched >> 20, r.fetches)
            } else {
                "-".into()
            }),
        ]);
    }
    t.notes.push(
        "Appends: 64 closed-loop writers (fsync'd acks), the same sizes with and without a \
         local budget, alternating, while a thread copies sealed segments into the stand-in \
         cold tier every 50 ms (the archiver's disk reads, without S3). Reads: each reader \
         reads its stream from offset 0 to the tail in 1 MiB ranges; latency is per range \
         read. The streams are interleaved in the log (64 KiB appends in turn), so a cold \
         read of one stream fetches whole 1 MiB blocks that mostly hold the other streams: \
         'fetched MiB' against 'MiB' is that amplification; readers of all streams at once \
         share the blocks. The cold tier stand-in waits the stated time per request, then \
         reads the page-cached copy on the core's thread. CPU is the whole process's."
            .into(),
    );
    Ok(t)
}

// ---------------------------------------------------------------------------------------------

fn main() -> Result<(), BoxError> {
    let args = parse_args()?;
    let root = std::env::temp_dir();
    check_not_tmpfs(&root)?;
    let scratch = temp_dir("probe")?;
    check_not_tmpfs(scratch.path())?;
    drop(scratch);
    let cmd: Vec<String> = std::env::args().collect();
    println!(
        "# ursula storage bench: scale={}, temp dir {}, {} CPUs, load average at start {}",
        args.scale.name,
        root.display(),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        loadavg()
    );
    let started = Instant::now();
    let mut tables = Vec::new();
    let sections: [(&str, Section); 6] = [
        ("append", section_append),
        ("layout", section_layout),
        ("prealloc", section_prealloc),
        ("recovery", section_recovery),
        ("read", section_read),
        ("cold", section_cold),
    ];
    for (name, run) in sections {
        if !args.only.iter().any(|s| s == name) {
            continue;
        }
        eprintln!("[{name}] load average {}", loadavg());
        let (t0, c0) = (Instant::now(), cpu_secs());
        let mut table = run(args.scale, &root)?;
        let (wall, cpu) = (t0.elapsed().as_secs_f64(), cpu_secs() - c0);
        table.notes.push(format!(
            "Section took {wall:.1} s wall, {cpu:.1} s process CPU; load average after: {}.",
            loadavg()
        ));
        table.print();
        tables.push(table);
    }
    println!(
        "\ntotal {:.1} s, load average {}",
        started.elapsed().as_secs_f64(),
        loadavg()
    );
    if let Some(path) = &args.json {
        let body: Vec<String> = tables.iter().map(Table::json).collect();
        let json = format!(
            "{{\"scale\": {}, \"command\": {}, \"unix_ms\": {}, \"load_average_end\": {}, \"tables\": [\n  {}\n]}}\n",
            json_str(args.scale.name),
            json_str(&cmd.join(" ")),
            ursula_storage::now_ms(),
            json_str(&loadavg()),
            body.join(",\n  ")
        );
        std::fs::write(path, json)?;
        println!("wrote {}", path.display());
    }
    Ok(())
}
