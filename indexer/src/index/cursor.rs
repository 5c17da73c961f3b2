//! Merge cursors: one per part (pruning row groups and pages by their time bounds before
//! decoding anything) or per sorted run of the in-memory tail, each yielding entries from
//! a lower bound on in `(t_ms, offset)` order.

use std::sync::Arc;

use crate::cache::PartCache;
use crate::error::Result;
use crate::part::{Entry, Group, PartFile};

pub(super) enum Cursor {
    Part(PartCursor),
    Run(Arc<Vec<Entry>>, usize),
}

pub(super) struct PartCursor {
    pub(super) key: String,
    pub(super) file: Arc<PartFile>,
    pub(super) rg: usize,
    /// Page slice within row group `rg`.
    pub(super) slice: usize,
    pub(super) group: Option<Arc<Group>>,
    pub(super) row: usize,
    pub(super) lb: (i64, u64),
    pub(super) until: i64,
}

impl PartCursor {
    fn next_slice(&mut self) {
        self.slice += 1;
        if self.slice >= self.file.pages.get(self.rg).map_or(0, |v| v.len()) {
            self.rg += 1;
            self.slice = 0;
        }
    }
}

impl Cursor {
    pub(super) async fn peek(&mut self, cache: &PartCache) -> Result<Option<Entry>> {
        match self {
            Cursor::Run(run, i) => Ok(run.get(*i).copied()),
            Cursor::Part(p) => loop {
                if p.group.is_none() {
                    // Row-group pruning by statistics, then page pruning inside the group
                    // by the page index: skip whatever lies entirely below the lower
                    // bound; stop at the first group or page starting at or after `until`.
                    while p.rg < p.file.groups.len() && p.file.groups[p.rg].2 < p.lb.0 {
                        p.rg += 1;
                        p.slice = 0;
                    }
                    let Some(&(_, min_t, _)) = p.file.groups.get(p.rg) else {
                        return Ok(None);
                    };
                    if min_t >= p.until {
                        return Ok(None);
                    }
                    let slices = &p.file.pages[p.rg];
                    while p.slice < slices.len() && slices[p.slice].max_t < p.lb.0 {
                        p.slice += 1;
                    }
                    let Some(sl) = slices.get(p.slice) else {
                        p.rg += 1;
                        p.slice = 0;
                        continue;
                    };
                    if sl.min_t >= p.until {
                        return Ok(None);
                    }
                    // The page's times alone say where the window starts in it, or that
                    // it starts past `until` (the common case of a narrow window over a
                    // part that spans the day): then no other column is decoded.
                    let times = cache.times(&p.key, p.rg, p.slice).await?;
                    match times.get(times.partition_point(|t| *t < p.lb.0)) {
                        Some(t) if *t >= p.until => return Ok(None),
                        Some(_) => {}
                        None => {
                            p.next_slice();
                            continue;
                        }
                    }
                    let g = cache.slice(&p.key, p.rg, p.slice).await?;
                    p.row = g.lower_bound(p.lb);
                    p.group = Some(g);
                }
                let Some(g) = &p.group else { return Ok(None) };
                if p.row < g.rows() {
                    return Ok(Some(g.entry(p.row)));
                }
                p.next_slice();
                p.group = None;
            },
        }
    }

    pub(super) fn advance(&mut self) {
        match self {
            Cursor::Run(_, i) => *i += 1,
            Cursor::Part(p) => p.row += 1,
        }
    }
}
