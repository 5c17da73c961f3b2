//! Removing streams: a client's delete (soft while forks still reference the stream),
//! expiry, and the fork references a removed fork gives back to its source. In a cluster
//! the source may be on a lane another host owns: that host is asked to release it
//! (`POST /__ursula/forks/release`, see `peer`).

use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;

use ursula_storage::{Shard, StorageError, StreamId};

use crate::core::Core;
use crate::ext::{Ext, ForkLink, Released};
use crate::http::{ApiError, Response};

/// How long a release on another host is tried while that host cannot be reached or the
/// source's lane moves (far longer than a failover), and the pauses between tries: they
/// double from the first to the longest. A release is idempotent (its token names the
/// reference), so trying again after an answer that got lost is safe.
const PEER_RELEASE_FOR: Duration = Duration::from_secs(600);
const PEER_RELEASE_FIRST_PAUSE: Duration = Duration::from_secs(1);
const PEER_RELEASE_LONGEST_PAUSE: Duration = Duration::from_secs(30);

/// DELETE: soft-delete while forks reference the stream, otherwise remove it. `shard` is
/// the one holding stream `id`.
pub async fn delete(core: &Rc<Core>, shard: &Shard, id: StreamId) -> Result<(), StorageError> {
    let mut ext = match shard.stream(id) {
        Some(s) => Ext::decode(s.ext()),
        None => return Ok(()),
    };
    if ext.referenced() {
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
    if core
        .lanes
        .check(core.placement.shard_of(&link.source))
        .is_ok()
    {
        release_here(core, link).await;
        return;
    }
    // The source's lane is elsewhere: its host releases it, in the background and again
    // until it answers (the caller's own removal is done and durable).
    let core = core.clone();
    monoio::spawn(async move {
        let started = std::time::Instant::now();
        let mut pause = PEER_RELEASE_FIRST_PAUSE;
        while started.elapsed() < PEER_RELEASE_FOR {
            match release_elsewhere(&core, &link).await {
                Ok(()) => return,
                Err(why) => tracing::debug!(
                    "releasing a fork reference on another host: {}",
                    why.reason()
                ),
            }
            monoio::time::sleep(pause).await;
            pause = (pause * 2).min(PEER_RELEASE_LONGEST_PAUSE);
        }
        tracing::warn!(
            source = %link.source,
            "could not release a fork reference on the source's host: the source stays \
             soft-deleted if it was deleted"
        );
    });
}

/// Ask the host that owns the source's lane to release `link`'s reference.
async fn release_elsewhere(core: &Rc<Core>, link: &ForkLink) -> Result<(), ApiError> {
    let Some(address) = crate::lanes::serving_host(core, &link.source).await? else {
        release_here(core, link.clone()).await;
        return Ok(());
    };
    let body = Bytes::from(sonic_rs::to_vec(link).unwrap_or_default());
    let path = "/__ursula/forks/release";
    let answer = crate::peer::post(core, &address, path, body)
        .await
        .map_err(|e| e.refusal())?;
    match answer.status {
        204 => Ok(()),
        _ => Err(answer.refusal(path)),
    }
}

/// `POST /__ursula/forks/release` on the host that owns a fork source's lane: give the
/// source the reference a fork on another host held.
pub async fn serve_release(core: &Rc<Core>, body: &[u8]) -> Response {
    let Ok(link) = sonic_rs::from_slice::<ForkLink>(body) else {
        return ApiError::InvalidJson.response();
    };
    if let Err(refused) = core.lanes.check(core.placement.shard_of(&link.source)) {
        return crate::lanes::refusal(core, refused).response();
    }
    release_here(core, link).await;
    Response::new(204).header("cache-control", "no-store")
}

/// Give back the reference a fork on this host asked for under `token` and may not have
/// got: its call to the source's host failed without an answer that decides it (the
/// connection broke, or the answer was lost). If the source's host took it, it is dropped;
/// if the take is still on its way, it is refused when it arrives.
pub fn give_back_untaken(core: &Rc<Core>, source: String, token: u64) {
    let link = ForkLink {
        source,
        // Unused: the token names the reference.
        source_incarnation: 0,
        offset: None,
        sub_offset: 0,
        token: Some(token),
    };
    let core = core.clone();
    monoio::spawn(async move { release(&core, link).await });
}

/// Give the source (on a lane this host serves) back the reference of `link`, removing it
/// when it was deleted and this was its last fork.
async fn release_here(core: &Rc<Core>, link: ForkLink) {
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
            // A token names its reference in whichever incarnation holds it; a plain count
            // belongs to the incarnation the fork was made from.
            if link.token.is_none() && incarnation != link.source_incarnation {
                return;
            }
            let released = ext.release_ref(link.token);
            let result = if released == Released::Dropped && !ext.referenced() && ext.soft_deleted {
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
