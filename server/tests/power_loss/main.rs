//! Power-loss test: the real `ursula` binary on a disk that forgets what was not synced.
//!
//! Each crash point mounts a fresh forgetful disk (`disk.rs`, a FUSE file system), starts
//! the server on it, and runs the long-mode crash workload (many streams, producers with
//! retries, JSON records, append-batch, close, delete and recreate, snapshots and
//! retention; `support/workload.rs`), on the smallest segments the engine allows so logs
//! roll, the cleaner moves data and checkpoints are written within a run.
//! The disk freezes at a mutating operation chosen at random (log-uniformly, so startup,
//! the first segment and longer runs are all hit), the server is killed there, and the
//! disk is cut as a power failure leaves it: only what was synced, plus a random subset
//! of the unsynced writes torn into 512 B or 4 KiB sectors, with durable or current
//! metadata. The server then recovers on that image, and every acknowledged append must
//! read back byte-exact at its offset and record ordinals, the one operation in flight per
//! stream must be absent or whole, producer retries must be answered as duplicates,
//! acknowledged snapshots must read back byte-exact and retention points hold, closed and
//! deleted streams must stay so, and the server must shut down cleanly (a clean stop
//! writes a checkpoint of the recovered state, which is then loaded once more and
//! checked again, so what recovery rebuilt and what the checkpoint holds must agree).
//!
//! `URSULA_POWER_LOSS_POINTS` (default 6) sets the number of crash points;
//! `URSULA_CRASH_SEED` replays a run, `URSULA_POWER_LOSS_POINT_SEED` one crash point (both
//! printed; thread scheduling still varies, so a replay hits the same operation number
//! with the same cut, not always the same bytes). `scripts/power-loss N` runs it in
//! release mode.

#[path = "../support/mod.rs"]
mod support;

mod disk;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use disk::{CutOptions, CutStats, Disk};
use support::workload::{
    read_log, run_writer, server_log_tail, verify_slot, Slot, Stats, BUCKET, SLOTS,
};
use support::{server_args, signal, temp_dir, write_config, Client, Rng, Server};

/// Writer threads per crash point (each owns a share of the stream slots).
const WRITERS: usize = 3;
/// Crash points are drawn from mutating operations `0..MAX_CRASH_OP`; a run that ends
/// sooner (the workload is time-bounded) crashes at its next operation.
const MAX_CRASH_OP: u64 = 20_000;
/// The server's data dir, inside the disk.
const DATA: &str = "data";
/// A running total is printed every this many points, so a long run that is stopped
/// early still says how far it got.
const PROGRESS_EVERY: usize = 250;
/// Longest workload per crash point.
const MAX_RUN: Duration = Duration::from_secs(3);
/// Share of crash points that start once more on the checkpoint of the clean stop after
/// recovery and verify again (a start and a verification cost about a quarter of a point).
const RECHECK_SHARE: f64 = 0.25;

#[test]
fn power_loss_keeps_every_acknowledged_append() {
    let points: usize = std::env::var("URSULA_POWER_LOSS_POINTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(6);
    let one: Option<u64> = std::env::var("URSULA_POWER_LOSS_POINT_SEED")
        .ok()
        .and_then(|v| v.parse().ok());
    let (mut rng, seed) = Rng::from_env_or_time();
    let points = if one.is_some() { 1 } else { points };
    println!(
        "power-loss: {points} crash points, seed {seed} (replay with URSULA_CRASH_SEED={seed})"
    );
    let started = Instant::now();
    let mut totals = Totals::default();
    for point in 1..=points {
        let point_seed = one.unwrap_or_else(|| rng.next_u64());
        let t0 = Instant::now();
        match crash_point(point_seed) {
            Ok(r) => {
                totals.add(&r);
                if point % PROGRESS_EVERY == 0 && point < points {
                    println!(
                        "power-loss progress: {}",
                        totals.summary(point, started.elapsed())
                    );
                }
                println!(
                    "point {point}/{points}: crash at op {} of {}{}; {} appends, {} frames, {} deletes, \
                     {} snapshots, {} retentions, {} retries acked, {:.1} MiB; image: {} segments{}{}; \
                     cut {:?}: {} files, {} pending writes, sectors {} kept {} lost; {} streams verified [{}]; {} ms",
                    r.crash_at,
                    r.applied,
                    if r.in_startup { " (during startup)" } else { "" },
                    r.stats.appends,
                    r.stats.frames,
                    r.stats.deletes,
                    r.stats.snapshots,
                    r.stats.retentions,
                    r.stats.retries,
                    r.stats.bytes as f64 / (1 << 20) as f64,
                    r.image.segments,
                    if r.image.cleaned { ", cleaned" } else { "" },
                    if r.image.checkpoints > 0 { ", checkpoint" } else { "" },
                    r.cut,
                    r.cut_stats.files,
                    r.cut_stats.pending_writes,
                    r.cut_stats.sectors_kept,
                    r.cut_stats.sectors_lost,
                    r.live,
                    r.outcomes.join(", "),
                    t0.elapsed().as_millis(),
                );
            }
            Err(f) => {
                println!(
                    "crash point {point} of {points} failed: {} acknowledged bytes lost",
                    f.lost
                );
                panic!(
                    "power-loss: crash point {point} failed (seed {seed}; replay this point with \
                     URSULA_POWER_LOSS_POINT_SEED={point_seed}): {}",
                    f.msg
                );
            }
        }
    }
    println!("power-loss: {}", totals.summary(points, started.elapsed()));
    println!("{points} crash points, 0 acknowledged bytes lost");
}

struct Failure {
    msg: String,
    /// Acknowledged bytes missing or changed after recovery.
    lost: u64,
}

struct PointReport {
    crash_at: u64,
    applied: u64,
    in_startup: bool,
    stats: Stats,
    cut: CutOptions,
    cut_stats: CutStats,
    live: usize,
    outcomes: Vec<String>,
    image: ImageShape,
}

#[derive(Default)]
struct Totals {
    stats: Stats,
    in_startup: usize,
    pending_writes: usize,
    sectors_lost: usize,
    rolled: usize,
    cleaned: usize,
    checkpointed: usize,
}

impl Totals {
    fn summary(&self, points: usize, elapsed: Duration) -> String {
        format!(
            "{points} points in {:.0} s, 0 acknowledged bytes lost; {} in startup; {:.0} MiB acked, {} appends, \
             {} frames, {} deletes, {} closes, {} snapshots, {} retentions, {} producer retries; crash images \
             with a rolled log {}, a cleaned segment {}, a checkpoint {}; {} pending writes cut, {} sectors lost",
            elapsed.as_secs_f64(),
            self.in_startup,
            self.stats.bytes as f64 / (1 << 20) as f64,
            self.stats.appends,
            self.stats.frames,
            self.stats.deletes,
            self.stats.closes,
            self.stats.snapshots,
            self.stats.retentions,
            self.stats.retries,
            self.rolled,
            self.cleaned,
            self.checkpointed,
            self.pending_writes,
            self.sectors_lost,
        )
    }

    fn add(&mut self, r: &PointReport) {
        self.stats.add(&r.stats);
        self.in_startup += r.in_startup as usize;
        self.rolled += r.image.rolled as usize;
        self.cleaned += r.image.cleaned as usize;
        self.checkpointed += (r.image.checkpoints > 0) as usize;
        self.pending_writes += r.cut_stats.pending_writes;
        self.sectors_lost += r.cut_stats.sectors_lost;
    }
}

/// What the workload had acknowledged when the server died.
struct Acked {
    slots: Vec<Slot>,
    bucket: bool,
    stats: Stats,
    errors: Vec<String>,
}

/// Let go of the FUSE mount at `mnt` if it is still there. fuser unmounts with a plain
/// umount(2), which fails with EBUSY while the kernel still holds a reference from the
/// killed server, and left a stale mount behind at a few percent of the points; a lazy
/// detach always succeeds, so a long run leaves no mounts and its temp dirs can be removed.
fn detach(mnt: &Path) {
    use std::os::unix::ffi::OsStrExt;
    let Ok(path) = std::ffi::CString::new(mnt.as_os_str().as_bytes()) else {
        return;
    };
    // SAFETY: `path` is a valid NUL-terminated string that outlives the call, and umount2
    // only reads it. EINVAL (nothing mounted there any more) is the usual, harmless answer.
    unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) };
}

/// One crash point in a fresh directory; a failure carries the end of the server's log.
fn crash_point(point_seed: u64) -> Result<PointReport, Failure> {
    let tmp = temp_dir("ursula-power-loss-");
    let log_path = tmp.path().join("server.stderr.log");
    let acked_bytes = AtomicU64::new(0);
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        run_point(point_seed, tmp.path(), &log_path, &acked_bytes)
    }))
    .unwrap_or_else(|p| {
        let msg = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        // Recovery did not come up: everything acknowledged is out of reach.
        Err(Failure {
            msg: format!("panicked: {msg}"),
            lost: acked_bytes.load(Ordering::Relaxed),
        })
    });
    outcome.map_err(|f| Failure {
        msg: format!(
            "{}\n--- last server log lines ---\n{}",
            f.msg,
            server_log_tail(&log_path)
        ),
        lost: f.lost,
    })
}

/// Run one crash point; `acked_bytes` is set to the stream bytes acknowledged before it.
fn run_point(
    point_seed: u64,
    tmp: &Path,
    log_path: &Path,
    acked_bytes: &AtomicU64,
) -> Result<PointReport, Failure> {
    let fail = |msg: String| Failure { msg, lost: 0 };
    let mut rng = Rng::new(point_seed);
    let (mnt, image) = (tmp.join("disk"), tmp.join("image"));
    std::fs::create_dir_all(&mnt).map_err(|e| fail(format!("mkdir: {e}")))?;
    std::fs::create_dir_all(&image).map_err(|e| fail(format!("mkdir: {e}")))?;
    // Smallest segments the engine allows, so logs roll and the cleaner runs.
    let cfg = write_config(tmp, "segment_bytes = 1\n");

    let crash_at = (MAX_CRASH_OP as f64).powf(rng.range(0, 1_000_000) as f64 / 1e6) as u64 - 1;
    let disk = Disk::new(crash_at);
    let session = disk
        .mount(&mnt)
        .map_err(|e| fail(format!("mount the FUSE disk at {}: {e}", mnt.display())))?;

    // The data dir is made by the server inside the disk, so its own entry is on the
    // forgetful disk too.
    let args = server_args(&mnt.join(DATA), "disk", 2, &["--config", &cfg]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let frozen = || disk.frozen();
    let spawned =
        Server::spawn_unless(&args, &[], Some(log_path), Duration::from_secs(60), &frozen);
    let in_startup = spawned.is_err();
    let acked = match spawned {
        Err(mut child) => {
            signal(child.id() as i32, libc::SIGKILL);
            disk.thaw();
            let _ = child.wait();
            Acked {
                slots: (0..SLOTS).map(|_| Slot::default()).collect(),
                bucket: false,
                stats: Stats::default(),
                errors: Vec::new(),
            }
        }
        Ok(server) => {
            let stop = Arc::new(AtomicBool::new(false));
            let workload = {
                let (addr, stop, seed) = (server.addr.clone(), stop.clone(), rng.next_u64());
                thread::spawn(move || workload(addr, stop, seed))
            };
            if !disk.wait_frozen(MAX_RUN) {
                disk.crash_now();
                disk.wait_frozen(Duration::from_secs(5));
            }
            // Killed while the disk holds the crash point's request; only then may it fail.
            signal(server.pid(), libc::SIGKILL);
            disk.thaw();
            server.kill9();
            stop.store(true, Ordering::Relaxed);
            workload.join().expect("workload thread panicked")
        }
    };
    if !acked.errors.is_empty() {
        return Err(fail(format!(
            "workload errors before the crash:\n{}",
            acked.errors.join("\n")
        )));
    }
    let applied = disk.ops_applied();
    let acked_total: u64 = acked
        .slots
        .iter()
        .filter(|s| s.exists)
        .map(|s| s.log.len() as u64)
        .sum();
    acked_bytes.store(acked_total, Ordering::Relaxed);
    let cut = CutOptions {
        survive: [0.0, 0.5, 0.9, 1.0][rng.range(0, 3) as usize],
        sector: if rng.chance(0.5) { 512 } else { 4096 },
        current_metadata: rng.chance(0.5),
    };
    let cut_stats = disk
        .crash_image(&mut rng, cut, &image)
        .map_err(|e| fail(format!("write the crash image: {e}")))?;
    drop(session);
    detach(&mnt);
    let data = image.join(DATA);
    let image_shape = ImageShape::of(&data);
    // A data dir that acknowledged anything must still know its shard count.
    if acked.bucket && !data.join("ursula.layout").exists() {
        return Err(Failure {
            msg: format!(
                "the data dir or its ursula.layout is gone after the cut (crash at op {crash_at}, cut {cut:?})"
            ),
            lost: acked_total,
        });
    }

    let server = Server::spawn_standard(&data, "disk", 2, &["--config", &cfg], Some(log_path));
    let mut slots = acked.slots;
    let mut client = server.client();
    let r = client
        .request("PUT", &format!("/{BUCKET}"), &[], &[])
        .map_err(|e| fail(format!("PUT bucket after recovery: {e}")))?;
    if !(r.status == 409 || !acked.bucket && r.status == 201) {
        return Err(Failure {
            msg: format!(
                "the acknowledged bucket is gone after recovery (PUT {})",
                r.status
            ),
            lost: acked_total,
        });
    }
    let where_ = format!("crash at op {crash_at}, cut {cut:?}");
    let (outcomes, live) = verify_all(&mut client, &mut rng, &mut slots, &where_)?;
    match server.sigterm(Duration::from_secs(10)) {
        Some(st) if st.success() => {}
        other => return Err(fail(format!("SIGTERM after recovery: {other:?}"))),
    }
    // The clean stop wrote a checkpoint of the recovered state; at some points, start on it
    // once more: the state it loads must be the one recovery rebuilt from the log.
    if live > 0 && rng.chance(RECHECK_SHARE) {
        let server = Server::spawn_standard(&data, "disk", 2, &["--config", &cfg], Some(log_path));
        let mut client = server.client();
        let where_ = format!("{where_}, restarted from the checkpoint of the clean stop");
        let (again, _) = verify_all(&mut client, &mut rng, &mut slots, &where_)?;
        if !again.is_empty() {
            return Err(fail(format!("{where_}: unresolved operations {again:?}")));
        }
        match server.sigterm(Duration::from_secs(10)) {
            Some(st) if st.success() => {}
            other => return Err(fail(format!("second SIGTERM: {other:?}"))),
        }
    }
    Ok(PointReport {
        crash_at,
        applied,
        in_startup,
        stats: acked.stats,
        cut,
        cut_stats,
        live,
        outcomes,
        image: image_shape,
    })
}

/// What a crash image holds of the engine's background work, so a run shows how often
/// the cut hit a rolled log, a log the cleaner had already shortened, or a checkpoint.
#[derive(Clone, Copy, Debug, Default)]
struct ImageShape {
    segments: usize,
    /// Some shard has a segment after its first.
    rolled: bool,
    /// Some shard's first segment is gone (the cleaner moved its live data and deleted it).
    cleaned: bool,
    checkpoints: usize,
}

impl ImageShape {
    fn of(data_dir: &Path) -> ImageShape {
        let mut shape = ImageShape::default();
        let Ok(shards) = std::fs::read_dir(data_dir) else {
            return shape;
        };
        for shard in shards.flatten() {
            let Ok(files) = std::fs::read_dir(shard.path()) else {
                continue;
            };
            let mut indexes = Vec::new();
            for f in files.flatten() {
                let name = f.file_name().to_string_lossy().into_owned();
                if let Some(i) = name
                    .strip_suffix(".seg")
                    .and_then(|n| n.parse::<u64>().ok())
                {
                    indexes.push(i);
                } else if name == "checkpoint" {
                    shape.checkpoints += 1;
                }
            }
            shape.segments += indexes.len();
            shape.rolled |= indexes.iter().any(|&i| i > 1);
            shape.cleaned |= !indexes.is_empty() && !indexes.contains(&1);
        }
        shape
    }
}

/// Bucket, then writer threads until `stop` or the server is gone.
fn workload(addr: String, stop: Arc<AtomicBool>, seed: u64) -> Acked {
    let mut rng = Rng::new(seed);
    let mut acked = Acked {
        slots: (0..SLOTS).map(|_| Slot::default()).collect(),
        bucket: false,
        stats: Stats::default(),
        errors: Vec::new(),
    };
    match Client::new(&addr).request("PUT", &format!("/{BUCKET}"), &[], &[]) {
        Ok(r) if r.status == 201 => acked.bucket = true,
        Ok(r) => {
            acked
                .errors
                .push(format!("create bucket: {} {}", r.status, r.body_str()));
            return acked;
        }
        Err(_) => return acked,
    }
    let mut owned: Vec<Vec<(usize, Slot)>> = (0..WRITERS).map(|_| Vec::new()).collect();
    for (i, s) in std::mem::take(&mut acked.slots).into_iter().enumerate() {
        owned[i % WRITERS].push((i, s));
    }
    let handles: Vec<_> = owned
        .into_iter()
        .enumerate()
        .map(|(id, mine)| {
            let (addr, stop, wseed) = (addr.clone(), stop.clone(), rng.next_u64());
            thread::spawn(move || run_writer(id, addr, mine, stop, wseed, 1))
        })
        .collect();
    let mut back = Vec::new();
    for h in handles {
        let (mine, st, errs) = h.join().expect("writer thread panicked");
        back.extend(mine);
        acked.stats.add(&st);
        acked.errors.extend(errs);
    }
    back.sort_by_key(|(i, _)| *i);
    acked.slots = back.into_iter().map(|(_, s)| s).collect();
    acked
}

/// Verify every slot against the model; the outcomes of in-flight operations and the
/// number of live streams.
fn verify_all(
    client: &mut Client,
    rng: &mut Rng,
    slots: &mut [Slot],
    where_: &str,
) -> Result<(Vec<String>, usize), Failure> {
    let mut outcomes = Vec::new();
    let mut live = 0;
    for (i, s) in slots.iter_mut().enumerate() {
        let acked_log = s.log.clone();
        let existed = s.exists;
        match verify_slot(client, rng, i, s) {
            Ok(o) if !o.is_empty() => outcomes.push(format!("s{i}: {o}")),
            Ok(_) => {}
            Err(e) => {
                let lost = if existed {
                    lost_bytes(client, i, &acked_log, s.retained)
                } else {
                    0
                };
                return Err(Failure {
                    msg: format!("s{i}: {e} ({where_})"),
                    lost,
                });
            }
        }
        live += s.exists as usize;
    }
    Ok((outcomes, live))
}

/// Acknowledged bytes of a slot after its retention point that recovery lost or changed.
fn lost_bytes(client: &mut Client, slot: usize, acked: &[u8], retained: u64) -> u64 {
    let acked = &acked[(retained as usize).min(acked.len())..];
    let Ok(log) = read_log(client, slot, retained) else {
        return acked.len() as u64;
    };
    let same = acked.iter().zip(&log).take_while(|(a, b)| a == b).count();
    (acked.len() - same) as u64
}
