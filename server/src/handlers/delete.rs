//! `DELETE` of a stream (P§8): soft while forks still reference it.

use std::rc::Rc;

use crate::core::Core;
use crate::http::Response;
use crate::lookup;
use crate::removal;

pub async fn delete(core: &Rc<Core>, key: &str) -> Response {
    let id = match lookup::live(core, key) {
        Ok(id) => id,
        Err(e) => return e.response(),
    };
    match removal::delete(core, id).await {
        Ok(()) => Response::new(204).header("cache-control", "no-store"),
        Err(e) => Response::from(e),
    }
}
