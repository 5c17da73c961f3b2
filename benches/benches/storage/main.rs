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
//! `cold` (appends with and without eviction to a stand-in cold tier, and cold reads),
//! `logs` (one core's streams over 1 to 64 logs).
//! Everything runs in temp dirs under the system temp dir, which must be on the real disk
//! (not tmpfs): the bench refuses to run on tmpfs.

use std::fmt::Write as _;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Instant;

use bytes::Bytes;
use hdrhistogram::Histogram;
use ursula_storage::{
    AppendRec, Durability, Lifetime, NewStream, Shard, ShardConfig, StorageError, StreamId,
    StreamMeta,
};

mod append;
mod cold;
mod layout;
mod logs;
mod prealloc;
mod read;
mod recovery;

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

const SECTIONS: [&str; 7] = [
    "append", "layout", "prealloc", "recovery", "read", "cold", "logs",
];

struct Args {
    scale: &'static Scale,
    json: Option<PathBuf>,
    only: Vec<String>,
}

const USAGE: &str =
    "usage: storage [--quick | --full] [--json FILE] [--only append,layout,prealloc,recovery,read,cold,logs]";

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
    let sections: [(&str, Section); 7] = [
        ("append", append::section_append),
        ("layout", layout::section_layout),
        ("prealloc", prealloc::section_prealloc),
        ("recovery", recovery::section_recovery),
        ("read", read::section_read),
        ("cold", cold::section_cold),
        ("logs", logs::section_logs),
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
