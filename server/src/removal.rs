//! Removing streams: a client's delete (soft while forks still reference the stream),
//! expiry, and the fork references a removed fork gives back to its source.

use std::rc::Rc;

use ursula_storage::{Shard, StorageError, StreamId};

use crate::core::Core;
use crate::ext::{Ext, ForkLink};

/// DELETE: soft-delete while forks reference the stream, otherwise remove it. `shard` is
/// the one holding stream `id`.
pub async fn delete(core: &Rc<Core>, shard: &Shard, id: StreamId) -> Result<(), StorageError> {
    let mut ext = match shard.stream(id) {
        Some(s) => Ext::decode(s.ext()),
        None => return Ok(()),
    };
    if ext.refs > 0 {
        ext.soft_deleted = true;
        return shard.set_ext(id, ext.encode())?.durable().await;
    }
    hard_delete(core, shard, id).await
}

async fn hard_delete(core: &Rc<Core>, shard: &Shard, id: StreamId) -> Result<(), StorageError> {
    let link = shard.stream(id).and_then(|s| Ext::decode(s.ext()).fork);
    shard.delete(id)?.durable().await?;
    if let Some(link) = link {
        release(core, link).await;
    }
    Ok(())
}

/// Remove an expired stream now and release its fork source's reference in the background.
/// The only place an expired stream is deleted: by the expiry sweep, or by a create that
/// needs its key.
pub fn remove_expired(core: &Rc<Core>, id: StreamId) {
    let core = core.clone();
    let shard = match core.shard(id) {
        Ok(shard) => shard,
        Err(e) => {
            // Whoever runs the shard next finds the stream expired and removes it.
            tracing::warn!("could not remove expired stream: {e}");
            return;
        }
    };
    let link = shard.stream(id).and_then(|s| Ext::decode(s.ext()).fork);
    match shard.delete(id) {
        Ok(commit) => {
            monoio::spawn(async move {
                if commit.durable().await.is_ok() {
                    if let Some(link) = link {
                        release(&core, link).await;
                    }
                }
            });
        }
        Err(e) => tracing::warn!("could not remove expired stream: {e}"),
    }
}

/// Drop one reference on a fork's source; a soft-deleted source with no references left
/// is removed, which may cascade up a chain of forks.
pub async fn release(core: &Rc<Core>, link: ForkLink) {
    let owner = core.owner_of(&link.source);
    let _ = core
        .on(owner, move |c| async move {
            let shard = match c.shard_for(&link.source) {
                Ok(shard) => shard,
                Err(e) => {
                    tracing::warn!("could not release a fork reference: {e}");
                    return;
                }
            };
            let Some(id) = shard.lookup(&link.source) else {
                return;
            };
            let (mut ext, incarnation) = match shard.stream(id) {
                Some(s) => (Ext::decode(s.ext()), s.incarnation()),
                None => return,
            };
            if incarnation != link.source_incarnation {
                return;
            }
            ext.refs = ext.refs.saturating_sub(1);
            let result = if ext.refs == 0 && ext.soft_deleted {
                Box::pin(hard_delete(&c, &shard, id)).await
            } else {
                match shard.set_ext(id, ext.encode()) {
                    Ok(commit) => commit.durable().await,
                    Err(e) => Err(e),
                }
            };
            if let Err(e) = result {
                tracing::warn!("releasing a fork reference failed: {e}");
            }
        })
        .await;
}
