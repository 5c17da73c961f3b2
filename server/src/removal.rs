//! Removing streams: a client's delete (soft while forks still reference the stream),
//! expiry, and the fork references a removed fork gives back to its source.

use std::rc::Rc;

use ursula_storage::{StorageError, StreamId};

use crate::core::Core;
use crate::ext::{Ext, ForkLink};

/// DELETE: soft-delete while forks reference the stream, otherwise remove it.
pub async fn delete(core: &Rc<Core>, id: StreamId) -> Result<(), StorageError> {
    let mut ext = match core.shard(id).stream(id) {
        Some(s) => Ext::decode(s.ext()),
        None => return Ok(()),
    };
    if ext.refs > 0 {
        ext.soft_deleted = true;
        return core.shard(id).set_ext(id, ext.encode())?.durable().await;
    }
    hard_delete(core, id).await
}

async fn hard_delete(core: &Rc<Core>, id: StreamId) -> Result<(), StorageError> {
    let link = core
        .shard(id)
        .stream(id)
        .and_then(|s| Ext::decode(s.ext()).fork);
    core.shard(id).delete(id)?.durable().await?;
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
    let link = core
        .shard(id)
        .stream(id)
        .and_then(|s| Ext::decode(s.ext()).fork);
    match core.shard(id).delete(id) {
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
            let Some(id) = c.shard_for(&link.source).lookup(&link.source) else {
                return;
            };
            let (mut ext, incarnation) = match c.shard(id).stream(id) {
                Some(s) => (Ext::decode(s.ext()), s.incarnation()),
                None => return,
            };
            if incarnation != link.source_incarnation {
                return;
            }
            ext.refs = ext.refs.saturating_sub(1);
            let result = if ext.refs == 0 && ext.soft_deleted {
                Box::pin(hard_delete(&c, id)).await
            } else {
                match c.shard(id).set_ext(id, ext.encode()) {
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
