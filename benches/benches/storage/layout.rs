//! 2. Layout: one shared log vs one O_DIRECT file per stream.

use std::cell::{Cell, RefCell};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::rc::Rc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use ursula_storage::aligned::AlignedBuf;
use ursula_storage::limits::IO_BLOCK_BYTES;

use crate::append::{engine_appends, AppendResult};
use crate::{block_on, histogram, median, ms, payload, BoxError, Scale, Table, Val};

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

pub(crate) fn section_layout(scale: &Scale, root: &Path) -> Result<Table, BoxError> {
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
