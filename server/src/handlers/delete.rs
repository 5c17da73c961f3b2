//! `DELETE` of a stream (P§8): soft while forks still reference it.

use std::rc::Rc;

use crate::core::Core;
use crate::http::{Handled, Response};
use crate::lookup;
use crate::removal;

pub async fn delete(core: &Rc<Core>, key: &str) -> Handled {
    let id = lookup::live(core, key)?;
    let shard = core.shard(id)?;
    removal::delete(core, &shard, id).await?;
    Ok(Response::new(204).header("cache-control", "no-store"))
}
