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
use prometheus_client::registry::Registry;

use crate::store::{DynStore, Fetched, Listed, Object, ObjectStore, PutMode, StoreResult};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct IndexLabel {
    pub index: String,
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
    pub events: Family<IndexLabel, Counter>,
    pub skipped: Family<SkipLabel, Counter>,
    pub commits: Family<IndexLabel, Counter>,
    pub cas_conflicts: Family<IndexLabel, Counter>,
    pub store_requests: Family<OpLabel, Counter>,
    pub query_seconds: Histogram,
}

impl Metrics {
    pub fn new() -> Arc<Metrics> {
        let mut registry = Registry::with_prefix("ursula_indexer");
        let m = Metrics {
            lag_bytes: Family::default(),
            lag_seconds: Family::default(),
            events: Family::default(),
            skipped: Family::default(),
            commits: Family::default(),
            cas_conflicts: Family::default(),
            store_requests: Family::default(),
            query_seconds: Histogram::new(exponential_buckets(0.000_1, 2.0, 18)),
            registry: Registry::default(),
        };
        registry.register(
            "ingest_lag_bytes",
            "Bytes between the indexed offset and the source's tail (owner only)",
            m.lag_bytes.clone(),
        );
        registry.register(
            "ingest_lag_seconds",
            "Seconds since the index last reached the source's tail, 0 when at the tail (owner only)",
            m.lag_seconds.clone(),
        );
        registry.register(
            "events_indexed",
            "Messages that produced an index entry",
            m.events.clone(),
        );
        registry.register(
            "events_skipped",
            "Messages skipped, by reason",
            m.skipped.clone(),
        );
        registry.register(
            "commits",
            "Manifest generations published by commits",
            m.commits.clone(),
        );
        registry.register(
            "cas_conflicts",
            "Commit compare-and-swaps that lost and were retried",
            m.cas_conflicts.clone(),
        );
        registry.register(
            "store_requests",
            "Requests sent to the object store, by operation",
            m.store_requests.clone(),
        );
        registry.register(
            "query_seconds",
            "Latency of event queries (merge and decode, no HTTP)",
            m.query_seconds.clone(),
        );
        Arc::new(Metrics { registry, ..m })
    }

    pub fn render(&self) -> Result<String, String> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .map_err(|e| e.to_string())?;
        Ok(out)
    }

    /// Drop the series of an index that is no longer open here.
    pub fn forget(&self, index: &str) {
        let l = IndexLabel {
            index: index.to_string(),
        };
        self.lag_bytes.remove(&l);
        self.lag_seconds.remove(&l);
    }
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
