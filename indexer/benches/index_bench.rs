//! Indexer benchmarks (in-process, release build):
//!
//! * ingest: framing + extraction of `/captured_at` (RFC 3339 string and integer ms) on
//!   one core;
//! * query: `Index::query` p50/p99 by window width and limit over N entries in parts on a
//!   local-directory store, warm cache, for time-disjoint parts (after compaction) and
//!   overlapping level-0 parts (no compaction), plus paging cost per page;
//! * bytes per entry of the Parquet parts.
//!
//! `cargo bench -p ursula-indexer --bench index_bench` (env `ENTRIES`, default 10000000).

use std::sync::Arc;
use std::time::{Duration, Instant};

use ursula_indexer::config::{Cli, Config};
use ursula_indexer::extract::{ExtractSpec, Extractor, Outcome};
use ursula_indexer::index::{Index, Query, Shared};
use ursula_indexer::manifest::{self, Manifest, PartMeta, Registration, Start};
use ursula_indexer::part::{self, Entry};
use ursula_indexer::source::SourceClient;
use ursula_indexer::store::{DynStore, LocalStore, PutMode};
use ursula_indexer::time::DAY_MS;

const DAY0: i64 = 1_784_332_800_000; // 2026-07-18T00:00:00Z

fn main() {
    let entries: usize = std::env::var("ENTRIES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000_000);
    // PART_COMPRESSION=none measures queries over uncompressed parts (--part-compression).
    let compression = match std::env::var("PART_COMPRESSION").as_deref() {
        Ok("none") => part::PartCompression::None,
        _ => part::PartCompression::Zstd,
    };
    ingest();
    layouts();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(query(entries, compression));
}

fn ingest() {
    let ex = Extractor::compile(&ExtractSpec::captured_at()).expect("extractor");
    for (name, ms_form) in [("rfc3339", false), ("integer ms", true)] {
        let n = 1_000_000usize;
        let mut body = Vec::with_capacity(n * 120);
        for i in 0..n {
            let t = DAY0 + (i as i64 * 7919) % DAY_MS;
            let ts = if ms_form {
                t.to_string()
            } else {
                format!(
                    "\"2026-07-18T{:02}:{:02}:{:02}.{:03}Z\"",
                    (t - DAY0) / 3_600_000,
                    (t / 60_000) % 60,
                    (t / 1000) % 60,
                    t % 1000
                )
            };
            body.extend_from_slice(
                format!("{{\"captured_at\":{ts},\"type\":\"network_response\",\"status\":200,\"url\":\"/api/v1/items/{i}\"}}\n")
                    .as_bytes(),
            );
        }
        let start = Instant::now();
        let mut ok = 0usize;
        let mut rest = &body[..];
        while let Some(i) = memchr::memchr(b'\n', rest) {
            if let Outcome::Entry { .. } = ex.extract(&rest[..i]) {
                ok += 1;
            }
            rest = &rest[i + 1..];
        }
        let el = start.elapsed();
        assert_eq!(ok, n);
        println!(
            "ingest ({name} captured_at, {} B/msg): {:.0} events/s on one core ({:.1} MB/s)",
            body.len() / n,
            n as f64 / el.as_secs_f64(),
            body.len() as f64 / el.as_secs_f64() / 1e6
        );
    }
}

/// Bytes per entry of one part of 1 M entries, in the current layout and in the first
/// one (dictionaries, plain encoding, ZSTD), over entries closer to real ones than the
/// query data below: event times that are a hash of the arrival order, messages of
/// 60-1000 bytes.
fn layouts() {
    let n = 1_000_000u64;
    let mut offset = 0u64;
    let mut entries: Vec<Entry> = (0..n)
        .map(|i| {
            let h = splitmix(i);
            let len = 60 + (h >> 40) % 940;
            let t = DAY0 + (h % DAY_MS as u64) as i64;
            let e = Entry {
                t_ms: t,
                t_end_ms: t,
                offset,
                len,
                record: None,
            };
            offset += len;
            e
        })
        .collect();
    entries.sort_by_key(|e| e.key());
    let first = parquet::file::properties::WriterProperties::builder()
        .set_compression(parquet::basic::Compression::ZSTD(Default::default()))
        .set_statistics_enabled(parquet::file::properties::EnabledStatistics::Page)
        .set_data_page_row_count_limit(part::PAGE_ROWS)
        .set_write_batch_size(part::PAGE_ROWS)
        .set_max_row_group_row_count(Some(part::ROW_GROUP_ROWS))
        .build();
    for (name, props) in [
        ("zstd", part::writer_properties(part::PartCompression::Zstd)),
        ("none", part::writer_properties(part::PartCompression::None)),
        ("first", first),
    ] {
        let bytes = part::encode_with(&entries, props).expect("encode");
        let f = part::PartFile::open(bytes.clone()).expect("open");
        let t = Instant::now();
        let mut slices = 0u32;
        for (i, pages) in f.pages.iter().enumerate().take(40) {
            for s in 0..pages.len() {
                std::hint::black_box(f.decode_slice(i, s).expect("slice").rows());
                slices += 1;
            }
        }
        println!(
            "layout {name:>7}: {:.2} bytes/entry (random times, 60-1000 B messages); cold page decode {:.1?}",
            bytes.len() as f64 / n as f64,
            t.elapsed() / slices
        );
    }
}

fn splitmix(i: u64) -> u64 {
    let mut z = i.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The query benchmark: the same entries published as time-disjoint (compacted) parts and
/// as overlapping L0 parts, each then measured for cold page decodes, time windows of
/// four widths and deep paging.
async fn query(n: usize, compression: part::PartCompression) {
    let dir = tempfile::tempdir().expect("tmp");
    let store: DynStore = Arc::new(LocalStore::open(dir.path()).expect("store"));
    let mut entries = spread_over_a_day(n);
    for (label, disjoint) in [
        ("time-disjoint parts (compacted)", true),
        ("overlapping L0 parts (uncompacted)", false),
    ] {
        let (shared, reg, first_part) = publish(
            &store,
            dir.path(),
            &mut entries,
            compression,
            label,
            disjoint,
        )
        .await;
        cold_page_decodes(first_part);
        let ix = Index::open(shared, reg).await.expect("open");
        windows(&ix).await;
        paging(&ix).await;
    }
}

/// `n` entries of 100 B messages with out-of-order event times spread over one day.
fn spread_over_a_day(n: usize) -> Vec<Entry> {
    (0..n as u64)
        .map(|i| {
            let t = DAY0 + ((i.wrapping_mul(2_654_435_761)) % DAY_MS as u64) as i64;
            Entry {
                t_ms: t,
                t_end_ms: t,
                offset: i * 100,
                len: 100,
                record: None,
            }
        })
        .collect()
}

/// Writes `entries` as parts (10 time-disjoint ones, or 40 overlapping L0 ones in commit
/// order) and a manifest naming them; returns what an index over them is opened with, and
/// the first part's bytes.
async fn publish(
    store: &DynStore,
    dir: &std::path::Path,
    entries: &mut [Entry],
    compression: part::PartCompression,
    label: &str,
    disjoint: bool,
) -> (Arc<Shared>, Registration, bytes::Bytes) {
    let n = entries.len();
    let parts_n = if disjoint { 10 } else { 40 };
    let reg = Registration {
        id: if disjoint { "a".into() } else { "b".into() },
        stream_url: format!("http://127.0.0.1:1/bench/{disjoint}"),
        extract: ExtractSpec::captured_at(),
        start: Start::Retained,
        indexed_from_offset: "00000000000000000000".into(),
        indexed_from_record: None,
        incarnation: None,
        restarted_from_incarnation: None,
        record_coordinates: false,
    };
    let ns = reg.namespace();
    let mut m = Manifest::initial(&reg);
    let t_build = Instant::now();
    let mut chunks: Vec<Vec<Entry>> = Vec::new();
    if disjoint {
        entries.sort_by_key(|e| e.key());
        chunks.extend(entries.chunks(n.div_ceil(parts_n)).map(|c| c.to_vec()));
    } else {
        // Commit order = offset order: each L0 part holds a contiguous offset range
        // with times all over the day.
        entries.sort_by_key(|e| e.offset);
        for c in entries.chunks(n.div_ceil(parts_n)) {
            let mut c = c.to_vec();
            c.sort_by_key(|e| e.key());
            chunks.push(c);
        }
    }
    let mut bytes_total = 0u64;
    let mut first_bytes = None;
    for c in &chunks {
        let bytes = part::encode(c, compression).expect("encode");
        first_bytes.get_or_insert_with(|| bytes.clone());
        bytes_total += bytes.len() as u64;
        let key = manifest::part_key(&ns, &bytes);
        store
            .put(&key, bytes.clone(), PutMode::Overwrite)
            .await
            .expect("put");
        m.parts.push(PartMeta {
            key,
            level: if disjoint { 1 } else { 0 },
            day_ms: DAY0,
            entries: c.len() as u64,
            min_t_ms: c[0].t_ms,
            max_t_ms: c[c.len() - 1].t_ms,
            max_t_end_ms: c[c.len() - 1].t_end_ms,
            max_span_ms: 0,
            min_offset: c.iter().map(|e| e.offset).min().unwrap_or(0),
            max_offset: c.iter().map(|e| e.offset).max().unwrap_or(0),
            bytes: 0,
        });
    }
    m.durable_offset = n as u64 * 100;
    m.floor_offset = 0;
    let cfg = Config::resolve(Cli {
        store_dir: Some(dir.to_path_buf()),
        cache_bytes: Some(4 << 30),
        ..Cli::default()
    })
    .expect("cfg");
    let shared = Shared::new(
        store.clone(),
        cfg,
        None,
        SourceClient::new().expect("client"),
    );
    manifest::cas(&shared.store, &manifest::current_key(&ns), &m, None)
        .await
        .expect("cas");
    println!(
        "\n{label}: {n} entries in {} parts, built in {:.1?}; {:.2} bytes/entry",
        chunks.len(),
        t_build.elapsed(),
        bytes_total as f64 / n as f64
    );
    (shared, reg, first_bytes.expect("first part"))
}

/// Every page slice of one part decoded once: what a query pays the first time it touches
/// a page.
fn cold_page_decodes(first_part: bytes::Bytes) {
    // Cold page decodes: every page slice of the first part, decoded once each (what
    // a query pays the first time it touches a page). A mean over many, so it holds up
    // on a noisy machine better than a p99.
    let first = part::PartFile::open(first_part).expect("open");
    let t = Instant::now();
    let mut slices = 0usize;
    for (i, pages) in first.pages.iter().enumerate() {
        for s in 0..pages.len() {
            std::hint::black_box(first.decode_slice(i, s).expect("slice").rows());
            slices += 1;
        }
    }
    println!(
        "  cold page decode: {:.1?} per 1024-row slice (mean of {slices})",
        t.elapsed() / slices as u32
    );
}

/// Query latency for windows of four widths at two limits, over a warm cache.
async fn windows(ix: &Index) {
    // Warm cache: every part opened (footer and page index decoded) before timing, as
    // a worker that has served queries has them. Pages are still decoded on first use.
    let all_day = Query {
        from: DAY0,
        until: DAY0 + DAY_MS,
        overlap: false,
        limit: 1,
        after: None,
        through: None,
        through_record: None,
    };
    ix.query(&all_day).await.expect("warm-up query");
    for (wname, width) in [
        ("100 ms", 100i64),
        ("1 min", 60_000),
        ("1 h", 3_600_000),
        ("1 day", DAY_MS),
    ] {
        for limit in [100usize, 1000] {
            let mut lat = Vec::new();
            for k in 0..220u64 {
                let from =
                    DAY0 + ((k.wrapping_mul(97_003)) % (DAY_MS - width).max(1) as u64) as i64;
                let q = Query {
                    from,
                    until: from + width,
                    overlap: false,
                    limit,
                    after: None,
                    through: None,
                    through_record: None,
                };
                let s = Instant::now();
                let r = ix.query(&q).await.expect("query");
                std::hint::black_box(r.entries.len());
                if k >= 20 {
                    lat.push(s.elapsed()); // the first 20 warm the cache
                }
            }
            lat.sort();
            println!(
                "  window {wname:>6}, limit {limit:>4}: p50 {:>9.3?} p99 {:>9.3?}",
                lat[lat.len() / 2],
                lat[lat.len() * 99 / 100]
            );
        }
    }
}

/// Paging through 10 000 rows at 100 per page: a page must not cost more the deeper it is.
async fn paging(ix: &Index) {
    // Paging through 10 000 rows at 100 per page.
    let from = DAY0 + 3_600_000;
    let mut q = Query {
        from,
        until: from + DAY_MS / 2,
        overlap: false,
        limit: 100,
        after: None,
        through: None,
        through_record: None,
    };
    let s = Instant::now();
    let mut pages = 0;
    let mut per_page: Vec<Duration> = Vec::new();
    while pages < 100 {
        let ps = Instant::now();
        let r = ix.query(&q).await.expect("query");
        per_page.push(ps.elapsed());
        pages += 1;
        match r.next {
            Some(n) => q.after = Some(n),
            None => break,
        }
    }
    let total = s.elapsed();
    let mean = |r: std::ops::Range<usize>| {
        let n = r.len().max(1) as u32;
        per_page[r].iter().sum::<Duration>() / n
    };
    // O(pages): the cost of a page must not grow with how deep it is.
    println!(
        "  paging 10k rows at 100/page: {total:.1?} total; mean of pages 1-10 {:.3?}, 46-55 {:.3?}, 91-100 {:.3?}",
        mean(0..10),
        mean(45..55),
        mean(90..per_page.len())
    );
}
