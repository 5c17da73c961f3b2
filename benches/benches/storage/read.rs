//! 5. Reads.

use std::path::Path;
use std::time::Instant;

use bytes::Bytes;
use ursula_storage::{Offset, Shard, StorageError, StreamId};

use crate::{
    block_on, create_streams, data_rec, disk_config, mb_per_s, payload, size_label, BoxError,
    Scale, Table, Val, KIB, MIB,
};

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

pub(crate) fn section_read(scale: &Scale, root: &Path) -> Result<Table, BoxError> {
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
