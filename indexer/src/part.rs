//! Parquet parts: immutable files of index entries sorted by `(t_ms, offset)`.
//!
//! Written with the `parquet` crate's column writers (no Arrow): see [`writer_properties`].
//! Readers keep the decoded footer per part (parts never change), prune whole row groups
//! by their `t_ms` min/max and pages by the page index before decoding any data, and can
//! decode a page's `t_ms` alone ([`PartFile::slice_times`]) to find where a window starts
//! before paying for the other columns.

use std::sync::Arc;

use bytes::Bytes;
use parquet::basic::{Compression, Encoding, ZstdLevel};
use parquet::column::reader::ColumnReader;
use parquet::data_type::Int64Type;
use parquet::file::page_index::column_index::ColumnIndexMetaData;
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::file::reader::{FileReader, RowGroupReader, SerializedFileReader};
use parquet::file::serialized_reader::ReadOptionsBuilder;
use parquet::file::statistics::Statistics;
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::parser::parse_message_type;

use crate::error::{Error, Result};

/// Rows per row group: the unit of pruning and of decoding at query time.
pub const ROW_GROUP_ROWS: usize = 8192;
/// Rows per data page: the granularity of the page index.
pub const PAGE_ROWS: usize = 1024;

const SCHEMA: &str = "message ursula_index_part {
    required int64 t_ms;
    required int64 t_end_ms;
    required int64 offset (INTEGER(64,false));
    required int64 len (INTEGER(64,false));
    optional int64 record (INTEGER(64,false));
}";

/// One index entry: a message's event time span and its locator in the source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub t_ms: i64,
    pub t_end_ms: i64,
    pub offset: u64,
    pub len: u64,
    /// Record ordinal, when the source advertises `json-record-coordinates-v1`.
    pub record: Option<u64>,
}

impl Entry {
    pub fn key(&self) -> (i64, u64) {
        (self.t_ms, self.offset)
    }
}

/// How parts are written: row groups of [`ROW_GROUP_ROWS`], pages of [`PAGE_ROWS`] with
/// page statistics and the page index, delta-encoded, no dictionaries, not compressed.
///
/// Times and offsets are nearly all distinct, so a dictionary does not shrink them, and a
/// dictionary page must be decompressed and decoded in full before any page of its chunk:
/// a query touching one 1024-row page paid for the whole row group's dictionary in every
/// column. Delta encoding packs the sorted `t_ms` and the near-constant `len` to a few bits.
///
/// ZSTD on top by default (the spec's part format); `PartCompression::None` leaves it
/// out: the parquet crate makes a new decompression context for every column reader, and
/// creating it cost ~2.5× the decompression itself (perf of `index_bench`), so a query's
/// first look at a page (a `t_ms` probe, then five columns) was mostly context set-up,
/// while bit-packed deltas leave ZSTD little to find.
pub fn writer_properties(compression: PartCompression) -> WriterProperties {
    let compression = match compression {
        PartCompression::Zstd => Compression::ZSTD(ZstdLevel::default()),
        PartCompression::None => Compression::UNCOMPRESSED,
    };
    WriterProperties::builder()
        .set_compression(compression)
        .set_dictionary_enabled(false)
        .set_encoding(Encoding::DELTA_BINARY_PACKED)
        .set_statistics_enabled(EnabledStatistics::Page)
        .set_data_page_row_count_limit(PAGE_ROWS)
        .set_write_batch_size(PAGE_ROWS)
        .set_max_row_group_row_count(Some(ROW_GROUP_ROWS))
        .set_created_by("ursula-indexer".into())
        .build()
}

/// How the column data of new parts is compressed (`--part-compression`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PartCompression {
    #[default]
    Zstd,
    None,
}

/// Encode `entries` (sorted by `(t_ms, offset)`) as one Parquet file.
pub fn encode(entries: &[Entry], compression: PartCompression) -> Result<Bytes> {
    encode_with(entries, writer_properties(compression))
}

/// [`encode`] with other writer properties (benchmarks compare layouts with it). Parts
/// written with any properties stay readable: readers follow each file's own metadata.
pub fn encode_with(entries: &[Entry], props: WriterProperties) -> Result<Bytes> {
    let schema = Arc::new(parse_message_type(SCHEMA)?);
    let props = Arc::new(props);
    let mut out = Vec::with_capacity(entries.len() * 8 + 1024);
    {
        let mut w = SerializedFileWriter::new(&mut out, schema, props)?;
        for chunk in entries.chunks(ROW_GROUP_ROWS) {
            let mut rg = w.next_row_group()?;
            let cols: [Vec<i64>; 4] = [
                chunk.iter().map(|e| e.t_ms).collect(),
                chunk.iter().map(|e| e.t_end_ms).collect(),
                chunk.iter().map(|e| e.offset as i64).collect(),
                chunk.iter().map(|e| e.len as i64).collect(),
            ];
            for col in &cols {
                let Some(mut c) = rg.next_column()? else {
                    return Err(Error::BadPart("schema has too few columns"));
                };
                c.typed::<Int64Type>().write_batch(col, None, None)?;
                c.close()?;
            }
            let records: Vec<i64> = chunk
                .iter()
                .filter_map(|e| e.record.map(|r| r as i64))
                .collect();
            let defs: Vec<i16> = chunk
                .iter()
                .map(|e| i16::from(e.record.is_some()))
                .collect();
            let Some(mut c) = rg.next_column()? else {
                return Err(Error::BadPart("schema has too few columns"));
            };
            c.typed::<Int64Type>()
                .write_batch(&records, Some(&defs), None)?;
            c.close()?;
            rg.close()?;
        }
        w.close()?;
    }
    Ok(Bytes::from(out))
}

/// An opened part: its bytes and decoded footer (with page index).
pub struct PartFile {
    reader: SerializedFileReader<Bytes>,
    /// Per row group: (rows, min t_ms, max t_ms).
    pub groups: Vec<(usize, i64, i64)>,
    /// Per row group, its `t_ms` pages from the page index: (first row, min, max). One
    /// slice covering the whole group when a file has no page index.
    pub pages: Vec<Vec<Slice>>,
}

/// Rows `first..next first` of a row group and their `t_ms` bounds.
#[derive(Debug, Clone, Copy)]
pub struct Slice {
    pub first_row: usize,
    pub min_t: i64,
    pub max_t: i64,
}

/// The decoded columns of one row group.
pub struct Group {
    pub t_ms: Vec<i64>,
    pub t_end_ms: Vec<i64>,
    pub offset: Vec<u64>,
    pub len: Vec<u64>,
    pub record: Vec<Option<u64>>,
}

impl Group {
    pub fn entry(&self, i: usize) -> Entry {
        Entry {
            t_ms: self.t_ms[i],
            t_end_ms: self.t_end_ms[i],
            offset: self.offset[i],
            len: self.len[i],
            record: self.record[i],
        }
    }

    pub fn rows(&self) -> usize {
        self.t_ms.len()
    }

    /// First row whose `(t_ms, offset)` is >= `key` (rows are sorted).
    pub fn lower_bound(&self, key: (i64, u64)) -> usize {
        let (mut lo, mut hi) = (0, self.rows());
        while lo < hi {
            let mid = (lo + hi) / 2;
            if (self.t_ms[mid], self.offset[mid]) < key {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    }

    pub fn approx_bytes(&self) -> usize {
        self.rows() * 48 + 64
    }
}

impl PartFile {
    pub fn open(bytes: Bytes) -> Result<PartFile> {
        let options = ReadOptionsBuilder::new().with_page_index().build();
        let reader = SerializedFileReader::new_with_options(bytes, options)?;
        let md = reader.metadata();
        let schema = md.file_metadata().schema_descr();
        let names: Vec<&str> = schema.columns().iter().map(|c| c.name()).collect();
        if names.len() < 4 || names[..4] != ["t_ms", "t_end_ms", "offset", "len"] {
            return Err(Error::PartSchema(
                names.iter().map(|n| n.to_string()).collect(),
            ));
        }
        let mut groups = Vec::with_capacity(md.num_row_groups());
        for rg in md.row_groups() {
            let (min, max) = match rg.column(0).statistics() {
                Some(Statistics::Int64(s)) => match (s.min_opt(), s.max_opt()) {
                    (Some(a), Some(b)) => (*a, *b),
                    _ => (i64::MIN, i64::MAX),
                },
                _ => (i64::MIN, i64::MAX),
            };
            groups.push((rg.num_rows().max(0) as usize, min, max));
        }
        let pages = (0..groups.len())
            .map(|i| {
                let whole = vec![Slice {
                    first_row: 0,
                    min_t: groups[i].1,
                    max_t: groups[i].2,
                }];
                let pi = md.page_index_for_row_group(i);
                let (Some(oi), Some(ColumnIndexMetaData::INT64(ci))) =
                    (pi.offset_index(0), pi.column_index(0))
                else {
                    return whole;
                };
                let locs = oi.page_locations();
                let mut out = Vec::with_capacity(locs.len());
                for (k, loc) in locs.iter().enumerate() {
                    let (Some(min), Some(max)) = (ci.min_value(k), ci.max_value(k)) else {
                        return whole;
                    };
                    out.push(Slice {
                        first_row: loc.first_row_index.max(0) as usize,
                        min_t: *min,
                        max_t: *max,
                    });
                }
                if out.is_empty() || out[0].first_row != 0 {
                    return whole;
                }
                out
            })
            .collect();
        Ok(PartFile {
            reader,
            groups,
            pages,
        })
    }

    /// Rows of slice `s` of row group `i`: only the pages holding them are decompressed
    /// and decoded (the offset index lets the column readers skip the others).
    pub fn decode_slice(&self, i: usize, s: usize) -> Result<Group> {
        let (first, end) = self.slice_rows(i, s)?;
        self.decode_rows(i, first, end)
    }

    pub fn decode_group(&self, i: usize) -> Result<Group> {
        let rows = self.groups.get(i).map(|g| g.0).unwrap_or(0);
        self.decode_rows(i, 0, rows)
    }

    /// Rows `first..end` of row group `i`, column `c`: (values, definition levels).
    fn read_column(
        &self,
        rg: &dyn RowGroupReader,
        c: usize,
        first: usize,
        end: usize,
    ) -> Result<(Vec<i64>, Vec<i16>)> {
        let rows = end - first;
        let mut values = Vec::with_capacity(rows);
        let mut defs = Vec::with_capacity(rows);
        if c >= rg.num_columns() {
            return Ok((values, defs));
        }
        let ColumnReader::Int64ColumnReader(mut r) = rg.get_column_reader(c)? else {
            return Err(Error::BadPart("unexpected column type"));
        };
        let mut skipped = 0;
        while skipped < first {
            let n = r.skip_records(first - skipped)?;
            if n == 0 {
                break;
            }
            skipped += n;
        }
        let mut got = 0;
        while got < rows {
            let (n, _, _) = r.read_records(rows - got, Some(&mut defs), None, &mut values)?;
            if n == 0 {
                break;
            }
            got += n;
        }
        Ok((values, defs))
    }

    fn slice_rows(&self, i: usize, s: usize) -> Result<(usize, usize)> {
        let slices = self
            .pages
            .get(i)
            .ok_or(Error::BadPart("no such row group"))?;
        let rows = self.groups.get(i).map(|g| g.0).unwrap_or(0);
        let first = slices
            .get(s)
            .ok_or(Error::BadPart("no such page"))?
            .first_row
            .min(rows);
        let end = slices.get(s + 1).map_or(rows, |n| n.first_row.min(rows));
        Ok((first, end.max(first)))
    }

    /// The `t_ms` column of slice `s` of row group `i` alone: one column to decompress, so
    /// a query can tell where its window starts in a page (or that it starts past it)
    /// before decoding the rest.
    pub fn slice_times(&self, i: usize, s: usize) -> Result<Vec<i64>> {
        let (first, end) = self.slice_rows(i, s)?;
        let rg = self.reader.get_row_group(i)?;
        let (t, _) = self.read_column(&*rg, 0, first, end)?;
        if t.len() != end - first {
            return Err(Error::BadPart("page shorter than its offset index says"));
        }
        Ok(t)
    }

    fn decode_rows(&self, i: usize, first: usize, end: usize) -> Result<Group> {
        let rg = self.reader.get_row_group(i)?;
        let rows = end - first;
        let mut cols: Vec<Vec<i64>> = Vec::with_capacity(5);
        let mut record_defs: Vec<i16> = Vec::new();
        for c in 0..5 {
            let (values, defs) = self.read_column(&*rg, c, first, end)?;
            if c == 4 {
                record_defs = defs;
            }
            cols.push(values);
        }
        let mut rec_iter = cols[4].iter();
        let record: Vec<Option<u64>> = if record_defs.len() == rows {
            record_defs
                .iter()
                .map(|d| {
                    if *d > 0 {
                        rec_iter.next().map(|v| *v as u64)
                    } else {
                        None
                    }
                })
                .collect()
        } else {
            vec![None; rows]
        };
        if cols[..4].iter().any(|c| c.len() != rows) {
            return Err(Error::BadPart("row group columns disagree in length"));
        }
        Ok(Group {
            offset: cols[2].iter().map(|v| *v as u64).collect(),
            len: cols[3].iter().map(|v| *v as u64).collect(),
            t_end_ms: std::mem::take(&mut cols[1]),
            t_ms: std::mem::take(&mut cols[0]),
            record,
        })
    }

    /// Every entry of the part (compaction, overlap verification).
    pub fn all(&self) -> Result<Vec<Entry>> {
        let mut out = Vec::new();
        for i in 0..self.groups.len() {
            let g = self.decode_group(i)?;
            out.extend((0..g.rows()).map(|r| g.entry(r)));
        }
        Ok(out)
    }

    pub fn has_page_index(&self) -> bool {
        self.reader.metadata().page_index().is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compression_is_what_was_asked_and_both_read_back() {
        let entries: Vec<Entry> = (0..5_000u64)
            .map(|i| Entry {
                t_ms: 1_000 + i as i64,
                t_end_ms: 1_000 + i as i64,
                offset: i * 10,
                len: 10,
                record: None,
            })
            .collect();
        for (c, want) in [
            (
                PartCompression::Zstd,
                Compression::ZSTD(ZstdLevel::default()),
            ),
            (PartCompression::None, Compression::UNCOMPRESSED),
        ] {
            let part = PartFile::open(encode(&entries, c).expect("encode")).expect("open");
            let md = part.reader.metadata();
            assert_eq!(md.row_group(0).column(0).compression(), want, "{c:?}");
            assert_eq!(part.all().expect("all"), entries, "{c:?}");
        }
    }

    #[test]
    fn round_trip_with_stats_and_page_index() {
        let mut entries: Vec<Entry> = (0..20_000u64)
            .map(|i| Entry {
                t_ms: 1_000_000 + (i as i64 * 7919) % 50_000,
                t_end_ms: 1_000_000 + (i as i64 * 7919) % 50_000 + 5,
                offset: i * 100,
                len: 100,
                record: if i % 3 == 0 { None } else { Some(i) },
            })
            .collect();
        entries.sort_by_key(|e| e.key());
        let bytes = encode(&entries, PartCompression::Zstd).expect("encode");
        let part = PartFile::open(bytes.clone()).expect("open");
        assert_eq!(part.groups.len(), 3);
        assert!(part.has_page_index());
        assert_eq!(part.groups[0].1, entries[0].t_ms);
        assert_eq!(part.all().expect("all"), entries);
        let g = part.decode_group(1).expect("group");
        let k = g.entry(100).key();
        assert_eq!(g.lower_bound(k), 100);
        // Page slices: 8 per full group, bounds from the column index, and decoding one
        // slice gives exactly its rows.
        assert_eq!(part.pages[1].len(), ROW_GROUP_ROWS / PAGE_ROWS);
        let mut row = 0;
        for (i, (rows, _, _)) in part.groups.iter().enumerate() {
            for (s, sl) in part.pages[i].iter().enumerate() {
                let got = part.decode_slice(i, s).expect("slice");
                assert_eq!(part.slice_times(i, s).expect("times"), got.t_ms);
                assert_eq!(got.t_ms.first().copied(), Some(sl.min_t));
                assert_eq!(got.t_ms.last().copied(), Some(sl.max_t));
                for r in 0..got.rows() {
                    assert_eq!(got.entry(r), entries[row + sl.first_row + r]);
                }
            }
            row += rows;
        }
        // Roughly: bytes per entry stays small.
        assert!(bytes.len() < entries.len() * 16, "{} bytes", bytes.len());
    }
}
