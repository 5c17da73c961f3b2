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
    ingest();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(query(entries));
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

async fn query(n: usize) {
    let dir = tempfile::tempdir().expect("tmp");
    let store: DynStore = Arc::new(LocalStore::open(dir.path()).expect("store"));
    let mut entries: Vec<Entry> = (0..n as u64)
        .map(|i| {
            // Out-of-order event times spread over one day, 100 B messages.
            let t = DAY0 + ((i.wrapping_mul(2_654_435_761)) % DAY_MS as u64) as i64;
            Entry {
                t_ms: t,
                t_end_ms: t,
                offset: i * 100,
                len: 100,
                record: None,
            }
        })
        .collect();
    for (label, disjoint) in [
        ("time-disjoint parts (compacted)", true),
        ("overlapping L0 parts (uncompacted)", false),
    ] {
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
        for c in &chunks {
            let bytes = part::encode(c).expect("encode");
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
            store_dir: Some(dir.path().to_path_buf()),
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
            .expect("io")
            .expect("cas");
        println!(
            "\n{label}: {n} entries in {} parts, built in {:.1?}; {:.2} bytes/entry",
            chunks.len(),
            t_build.elapsed(),
            bytes_total as f64 / n as f64
        );
        let ix = Index::open(shared, reg).await.expect("open");
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
                    let r = ix.query(&q).await.ok().expect("query");
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
            let r = ix.query(&q).await.ok().expect("query");
            per_page.push(ps.elapsed());
            pages += 1;
            match r.next {
                Some(n) => q.after = Some(n),
                None => break,
            }
        }
        println!(
            "  paging 10k rows at 100/page: {:.1?} total, first page {:.3?}, last page {:.3?}",
            s.elapsed(),
            per_page[0],
            per_page[per_page.len() - 1]
        );
    }
}
