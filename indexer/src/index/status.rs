//! Status changes: `resume` from the API, and from the owner's ingest a blocked index
//! (two workers disagree about the same source bytes), a source that is gone or back, and
//! a recreated source (a new incarnation, so a new namespace).

use super::{missing, Index};
use crate::error::{Error, Result};
use crate::manifest::{self, Catalog, Manifest, RetiredNamespace, Status};
use crate::source;
use crate::time::now_ms;

impl Index {
    /// `POST …/status/resume`: `blocked` → `ready`; `ready` stays; `source_gone` →
    /// [`Error::SourceGone`].
    pub async fn resume(&self) -> Result<()> {
        let key = manifest::current_key(&self.ns);
        let (r, _) =
            manifest::update::<Manifest, Result<()>>(&self.shared.store, &key, 16, |cur| {
                let Some(cur) = cur else {
                    return Err(missing(&key));
                };
                match cur.status {
                    Status::Ready => Ok((None, Ok(()))),
                    Status::SourceGone => Ok((None, Err(Error::SourceGone))),
                    Status::Blocked { .. } => {
                        let mut next = cur.clone();
                        next.generation += 1;
                        next.status = Status::Ready;
                        Ok((Some(next), Ok(())))
                    }
                }
            })
            .await?;
        self.refresh().await?;
        r
    }

    pub(super) async fn set_status(&self, status: Status, only_from: Option<Status>) -> Result<()> {
        let key = manifest::current_key(&self.ns);
        manifest::update::<Manifest, ()>(&self.shared.store, &key, 16, |cur| {
            let Some(cur) = cur else {
                return Err(missing(&key));
            };
            if cur.status == status || only_from.as_ref().is_some_and(|f| &cur.status != f) {
                return Ok((None, ()));
            }
            let mut next = cur.clone();
            next.generation += 1;
            next.status = status.clone();
            Ok((Some(next), ()))
        })
        .await?;
        self.refresh().await
    }

    /// A new `Stream-Incarnation`: rebind the registration to the recreated stream (a new
    /// namespace) and retire the old namespace.
    pub(super) async fn restart(&self, head: &source::Head) -> Result<()> {
        let old_ns = self.ns.clone();
        let id = self.reg.id.clone();
        let old_inc = self.reg.incarnation.clone();
        manifest::update::<Catalog, ()>(&self.shared.store, manifest::CATALOG_KEY, 32, |cur| {
            let Some(cur) = cur else {
                return Err(missing(manifest::CATALOG_KEY));
            };
            let mut next = cur.clone();
            let Some(r) = next
                .registrations
                .iter_mut()
                .find(|r| r.id == id && r.namespace() == old_ns)
            else {
                return Ok((None, ())); // someone else already restarted (or deleted) it
            };
            r.incarnation = head.incarnation.clone();
            r.indexed_from_offset = source::offset_token(head.retained_offset);
            r.indexed_from_record = if head.record_coordinates {
                head.record_first
            } else {
                None
            };
            r.record_coordinates = head.record_coordinates;
            r.restarted_from_incarnation = old_inc.clone();
            if next.retired.iter().any(|t| t.namespace == r.namespace()) {
                return Ok((None, ())); // a stale HEAD pointing at a retired namespace
            }
            next.retired.push(RetiredNamespace {
                id: id.clone(),
                namespace: old_ns.clone(),
                retired_at_ms: now_ms(),
            });
            Ok((Some(next), ()))
        })
        .await?;
        tracing::info!(index = %id, "source recreated: restarted from incarnation {old_inc:?}");
        Ok(())
    }

    pub(super) async fn block(&self, offset: u64, reason: String) -> Result<()> {
        tracing::error!(index = %self.reg.id, "blocking index: {reason}");
        self.set_status(
            Status::Blocked {
                offset: source::offset_token(offset),
                reason,
            },
            None,
        )
        .await
    }
}
