//! Long-mode crash checker: many streams on the bucketed surface, every kind of write
//! (text, binary, JSON with record ranges, idempotent producers, append-batch,
//! close-with-append, close, delete and recreate), `kill -9` at a random point, restart
//! on the same data dir, and a full verification of the model against the server.
//!
//! Each stream slot is owned by exactly one writer thread, so the model of a slot is an
//! exact sequence of acknowledged operations plus at most one operation in flight at the
//! kill. After a restart that in-flight operation must be either absent or whole (an
//! append-batch: a prefix of whole frames), never partial, and everything acknowledged
//! must be there byte-exact at its acknowledged offsets with its acknowledged record
//! ordinals; producer retries must still be deduplicated with their original receipts;
//! closed streams stay closed, deleted ones stay deleted, and `Stream-Incarnation` is
//! unchanged for surviving streams and new for recreated ones.
//!
//! `URSULA_CRASH_LONG_CYCLES` (default 3) sets the number of kill/restart cycles;
//! `URSULA_CRASH_SEED` replays a run (the seed is printed at the start).
//! `scripts/crash-loop --long --cycles N` runs only this test, in release mode.

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use support::workload::{
    disk_usage, fail_with_log, run_writer, verify_slot, Slot, Stats, BUCKET, SLOTS, WRITERS,
};
use support::{temp_dir, write_config, Rng, Server};

#[test]
fn kill9_long_mode_many_streams_every_operation() {
    let cycles: usize = std::env::var("URSULA_CRASH_LONG_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let (mut rng, seed) = Rng::from_env_or_time();
    println!("crash_long: {cycles} cycles, seed {seed} (replay with URSULA_CRASH_SEED={seed})");

    let tmp = temp_dir("ursula-crash-long-");
    let data_dir = tmp.path().join("data");
    std::fs::create_dir_all(&data_dir).unwrap();
    let log_path = tmp.path().join("server.stderr.log");
    // Smallest segments the engine allows, so cleaning starts early.
    let cfg = write_config(tmp.path(), "segment_bytes = 1\n");
    let spawn =
        || Server::spawn_standard(&data_dir, "disk", 2, &["--config", &cfg], Some(&log_path));

    let mut slots: Vec<Slot> = (0..SLOTS).map(|_| Slot::default()).collect();
    let mut server = spawn();
    {
        let mut c = server.client();
        let r = c.request("PUT", &format!("/{BUCKET}"), &[], &[]).unwrap();
        assert_eq!(r.status, 201, "create bucket: {}", r.body_str());
    }
    let mut totals = Stats::default();
    let started = Instant::now();
    for cycle in 1..=cycles {
        let stop = Arc::new(AtomicBool::new(false));
        let mut owned: Vec<Vec<(usize, Slot)>> = (0..WRITERS).map(|_| Vec::new()).collect();
        for (i, s) in std::mem::take(&mut slots).into_iter().enumerate() {
            owned[i % WRITERS].push((i, s));
        }
        let handles: Vec<_> = owned
            .into_iter()
            .enumerate()
            .map(|(id, mine)| {
                let (addr, stop) = (server.addr.clone(), stop.clone());
                let wseed = rng.next_u64();
                thread::spawn(move || run_writer(id, addr, mine, stop, wseed, cycle))
            })
            .collect();
        let delay = rng.range(200, 2500);
        thread::sleep(Duration::from_millis(delay));
        server.kill9();
        stop.store(true, Ordering::Relaxed);
        let mut stats = Stats::default();
        let mut errors = Vec::new();
        let mut back: Vec<(usize, Slot)> = Vec::new();
        for h in handles {
            let (mine, st, errs) = h.join().expect("writer thread panicked");
            back.extend(mine);
            stats.add(&st);
            errors.extend(errs);
        }
        back.sort_by_key(|(i, _)| *i);
        slots = back.into_iter().map(|(_, s)| s).collect();
        if !errors.is_empty() {
            fail_with_log(
                &log_path,
                format!("cycle {cycle}: writer errors:\n{}", errors.join("\n")),
            );
        }
        totals.add(&stats);

        let t0 = Instant::now();
        server = spawn();
        let restart_ms = t0.elapsed().as_millis();
        let mut client = server.client();
        let r = client
            .request("PUT", &format!("/{BUCKET}"), &[], &[])
            .unwrap();
        if r.status != 409 {
            fail_with_log(
                &log_path,
                format!("cycle {cycle}: bucket after restart: PUT {}", r.status),
            );
        }
        let mut outcomes = Vec::new();
        let (mut live, mut closed, mut live_bytes) = (0, 0, 0usize);
        for (i, s) in slots.iter_mut().enumerate() {
            match verify_slot(&mut client, &mut rng, i, s) {
                Ok(o) if !o.is_empty() => outcomes.push(format!("s{i}: {o}")),
                Ok(_) => {}
                Err(e) => fail_with_log(&log_path, format!("cycle {cycle}: s{i}: {e}")),
            }
            if s.exists {
                live += 1;
                live_bytes += s.log.len();
                closed += s.closed as usize;
            }
        }
        let (segs, seg_mib, low, cps) = disk_usage(&data_dir);
        println!(
            "cycle {cycle}/{cycles}: kill -9 after {delay} ms; acked {} appends ({} producer), {} batches ({} frames), \
             {} closes, {} deletes, {} creates, {} refused-closed, {:.1} MiB, {} 503s; {} in flight [{}]; \
             restart {restart_ms} ms; {live} live streams ({closed} closed, {:.1} MiB verified); \
             disk: {segs} segments {seg_mib:.0} MiB, lowest #{low}, {cps} checkpoint files",
            stats.appends,
            stats.producer,
            stats.batches,
            stats.frames,
            stats.closes,
            stats.deletes,
            stats.creates,
            stats.refused_closed,
            stats.bytes as f64 / (1 << 20) as f64,
            stats.rejected_503,
            stats.in_flight,
            outcomes.join(", "),
            live_bytes as f64 / (1 << 20) as f64,
        );
    }
    match server.sigterm(Duration::from_secs(10)) {
        Some(st) if st.success() => {}
        other => fail_with_log(
            &log_path,
            format!("SIGTERM: server did not exit 0: {other:?}"),
        ),
    }
    println!(
        "crash_long: {cycles} cycles passed in {:.0} s; total {:.0} MiB acked, {} appends, {} frames, {} deletes, {} closes",
        started.elapsed().as_secs_f64(),
        totals.bytes as f64 / (1 << 20) as f64,
        totals.appends,
        totals.frames,
        totals.deletes,
        totals.closes
    );
}
