//! 3. Preallocation (plain std + libc, synchronous).

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::time::Instant;

use hdrhistogram::Histogram;
use ursula_storage::aligned::AlignedBuf;
use ursula_storage::limits::IO_BLOCK_BYTES;

use crate::{histogram, median, ms, BoxError, Scale, Table, Val, MIB};

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

pub(crate) fn section_prealloc(scale: &Scale, root: &Path) -> Result<Table, BoxError> {
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
