//! The time-window query: which entries of the parts and the tail have an event time in
//! `[from, until)`, merged in `(t_ms, offset)` order and paged by a cursor token.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;

use super::cursor::{Cursor, PartCursor};
use super::{Index, View};
use crate::error::{Error, Result};
use crate::part::Entry;
use crate::source;

#[derive(Debug, Clone, Copy)]
pub struct Query {
    pub from: i64,
    pub until: i64,
    pub overlap: bool,
    pub limit: usize,
    pub after: Option<(i64, u64)>,
    pub through: Option<u64>,
    pub through_record: Option<u64>,
}

pub struct QueryResult {
    pub view: Arc<View>,
    pub through: u64,
    pub entries: Vec<Entry>,
    pub next: Option<(i64, u64)>,
}

/// Cursor token: 16 hex digits of `t_ms` with the sign bit flipped, then 16 of the offset,
/// so tokens sort as strings exactly like `(t_ms, offset)`.
pub fn encode_cursor(k: (i64, u64)) -> String {
    format!("{:016x}{:016x}", (k.0 as u64) ^ (1 << 63), k.1)
}

pub fn decode_cursor(s: &str) -> Option<(i64, u64)> {
    if s.len() != 32 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let t = u64::from_str_radix(&s[..16], 16).ok()? ^ (1 << 63);
    let o = u64::from_str_radix(&s[16..], 16).ok()?;
    Some((t as i64, o))
}

impl Index {
    pub async fn query(&self, q: &Query) -> Result<QueryResult> {
        let view = self.view();
        let m = &view.manifest;
        let indexed = view.indexed();
        let through = q.through.unwrap_or(indexed);
        if through < m.indexed_from_offset || through > indexed {
            return Err(Error::BadQuery(format!(
                "through must lie between coverage.from ({}) and the indexed offset ({})",
                source::offset_token(m.indexed_from_offset),
                source::offset_token(indexed)
            )));
        }
        let floor = view.floor();
        let mut cursors: Vec<Cursor> = Vec::new();
        for p in &m.parts {
            let t_hit = if q.overlap {
                p.max_t_end_ms >= q.from && p.min_t_ms < q.until
            } else {
                p.max_t_ms >= q.from && p.min_t_ms < q.until
            };
            if !t_hit || p.max_offset < floor || p.min_offset >= through {
                continue;
            }
            let lb = lower_bound(q, p.max_span_ms);
            let file = self.shared.cache.file(&p.key).await?;
            cursors.push(Cursor::Part(PartCursor {
                key: p.key.clone(),
                file,
                rg: 0,
                slice: 0,
                group: None,
                row: 0,
                lb,
                until: q.until,
            }));
        }
        if let Some(t) = view.tail() {
            let lb = lower_bound(q, t.max_span_ms);
            for run in &t.runs {
                let start = run.partition_point(|e| e.key() < lb);
                cursors.push(Cursor::Run(run.clone(), start));
            }
        }
        let cache = &self.shared.cache;
        let mut heap = BinaryHeap::new();
        for (i, c) in cursors.iter_mut().enumerate() {
            if let Some(e) = c.peek(cache).await? {
                if e.t_ms < q.until {
                    heap.push(Reverse((e.key(), i)));
                }
            }
        }
        let mut out: Vec<Entry> = Vec::with_capacity(q.limit.min(1024) + 1);
        let mut last: Option<(i64, u64)> = None;
        while let Some(Reverse((_, i))) = heap.pop() {
            let c = &mut cursors[i];
            let Some(e) = c.peek(cache).await? else {
                continue;
            };
            c.advance();
            if let Some(n) = c.peek(cache).await? {
                if n.t_ms < q.until {
                    heap.push(Reverse((n.key(), i)));
                }
            }
            let keep = e.offset >= floor
                && e.offset < through
                && (!q.overlap || e.t_end_ms >= q.from)
                && q.through_record
                    .is_none_or(|tr| e.record.is_none_or(|r| r < tr))
                && last != Some(e.key());
            if !keep {
                continue;
            }
            last = Some(e.key());
            out.push(e);
            if out.len() > q.limit {
                break;
            }
        }
        let next = if out.len() > q.limit {
            out.truncate(q.limit);
            out.last().map(|e| e.key())
        } else {
            None
        };
        Ok(QueryResult {
            view,
            through,
            entries: out,
            next,
        })
    }
}

fn lower_bound(q: &Query, max_span_ms: i64) -> (i64, u64) {
    let t = if q.overlap {
        q.from.saturating_sub(max_span_ms.max(0))
    } else {
        q.from
    };
    let lb = (t, 0);
    match q.after {
        Some((t, o)) => lb.max((t, o.saturating_add(1))),
        None => lb,
    }
}
