//! `GET /metrics`: Prometheus text exposition (prometheus-client).
//!
//! Per-index series carry an `index` label; everything about the object store counts the
//! requests that really reach it (after manifest sharding and packing).

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Metric, Registry};

use crate::store::{DynStore, Fetched, Listed, Object, ObjectStore, PutMode, StoreResult};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct IndexLabel {
    pub index: String,
}

impl IndexLabel {
    pub fn of(index: &str) -> IndexLabel {
        IndexLabel {
            index: index.to_string(),
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SkipLabel {
    pub index: String,
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpLabel {
    pub op: &'static str,
}

pub struct Metrics {
    registry: Registry,
    pub lag_bytes: Family<IndexLabel, Gauge>,
    pub lag_seconds: Family<IndexLabel, Gauge<f64, std::sync::atomic::AtomicU64>>,
    pub blocked: Family<IndexLabel, Gauge>,
    pub source_refused: Family<IndexLabel, Gauge>,
    pub events: Family<IndexLabel, Counter>,
    pub skipped: Family<SkipLabel, Counter>,
    pub commits: Family<IndexLabel, Counter>,
    pub cas_conflicts: Family<IndexLabel, Counter>,
    pub store_requests: Family<OpLabel, Counter>,
    pub query_seconds: Histogram,
}

impl Metrics {
    pub fn new() -> Arc<Metrics> {
        let mut r = Registry::with_prefix("ursula_indexer");
        let query_seconds = Histogram::new(exponential_buckets(0.000_1, 2.0, 18));
        r.register(
            "query_seconds",
            "Latency of event queries (merge and decode, no HTTP)",
            query_seconds.clone(),
        );
        Arc::new(Metrics {
            lag_bytes: family(
                &mut r,
                "ingest_lag_bytes",
                "Bytes between the indexed offset and the source's tail (owner only)",
            ),
            lag_seconds: family(
                &mut r,
                "ingest_lag_seconds",
                "Seconds since the index last reached the source's tail, 0 when at the tail (owner only)",
            ),
            blocked: family(
                &mut r,
                "index_blocked",
                "1 while the index is blocked (two workers extracted different entries from the same source bytes) until POST /v1/indexes/{id}/status/resume, else 0 (every worker that has the index open)",
            ),
            source_refused: family(
                &mut r,
                "source_refused",
                "1 while the source answers this worker's reads of the index with 401 or 403 (no token, a token the server does not accept, or one that may not read the stream), else 0 (owner only)",
            ),
            events: family(&mut r, "events_indexed", "Messages that produced an index entry"),
            skipped: family(&mut r, "events_skipped", "Messages skipped, by reason"),
            commits: family(&mut r, "commits", "Manifest generations published by commits"),
            cas_conflicts: family(
                &mut r,
                "cas_conflicts",
                "Commit compare-and-swaps that lost and were retried",
            ),
            store_requests: family(
                &mut r,
                "store_requests",
                "Requests sent to the object store, by operation",
            ),
            query_seconds,
            registry: r,
        })
    }

    pub fn render(&self) -> crate::error::Result<String> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }

    /// Drop the series of an index that is no longer open here.
    pub fn forget(&self, index: &str) {
        let l = IndexLabel::of(index);
        self.lag_bytes.remove(&l);
        self.lag_seconds.remove(&l);
        self.blocked.remove(&l);
        self.source_refused.remove(&l);
    }
}

/// A new metric family registered under `name`.
fn family<F: Metric + Clone + Default>(r: &mut Registry, name: &str, help: &str) -> F {
    let f = F::default();
    r.register(name, help, f.clone());
    f
}

/// Counts every request that reaches the real store.
pub struct Counting {
    pub inner: DynStore,
    pub metrics: Arc<Metrics>,
}

impl Counting {
    fn count(&self, op: &'static str) {
        self.metrics
            .store_requests
            .get_or_create(&OpLabel { op })
            .inc();
    }
}

#[async_trait]
impl ObjectStore for Counting {
    async fn get(&self, key: &str) -> StoreResult<Option<Object>> {
        self.count("get");
        self.inner.get(key).await
    }

    async fn get_if_changed(&self, key: &str, etag: Option<&str>) -> StoreResult<Fetched> {
        self.count("get");
        self.inner.get_if_changed(key, etag).await
    }

    async fn get_range(&self, key: &str, start: u64, len: u64) -> StoreResult<Option<Bytes>> {
        self.count("get");
        self.inner.get_range(key, start, len).await
    }

    async fn put(&self, key: &str, bytes: Bytes, mode: PutMode) -> StoreResult<String> {
        self.count("put");
        self.inner.put(key, bytes, mode).await
    }

    async fn delete(&self, key: &str) -> StoreResult<()> {
        self.count("delete");
        self.inner.delete(key).await
    }

    async fn list(&self, prefix: &str) -> StoreResult<Vec<Listed>> {
        self.count("list");
        self.inner.list(prefix).await
    }

    fn describe(&self) -> String {
        self.inner.describe()
    }
}
