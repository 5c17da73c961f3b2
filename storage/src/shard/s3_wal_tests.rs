//! The shard with S3 durability, against a cold tier whose WAL PUTs the test holds or lets
//! through: what a restart makes readable of a log that ends past S3's copy.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use crate::cold::{ColdRead, ColdStore, DurableEnd, WalPut};
use crate::position::{off, Offset};
use crate::record::Lifetime;
use crate::test_support::block_on;
use crate::wal::WalObject;

use super::*;

/// A cold tier that keeps no segments: it completes WAL PUTs while `puts_succeed` (and
/// remembers the last LSN they held), leaves them hanging otherwise, and reports the
/// archived end the test sets.
#[derive(Debug, Default)]
struct WalOnlyStore {
    puts_succeed: AtomicBool,
    in_s3: AtomicU64,
    archived: AtomicU64,
    /// S3's end of the log when the shard opened (what a claim found).
    s3_end_at_open: Mutex<Option<DurableEnd>>,
}

impl ColdStore for WalOnlyStore {
    fn is_archived(&self, _: u32, _: SegmentNo) -> bool {
        false
    }

    fn read(&self, _: u32, _: SegmentNo, _: u64, _: usize) -> ColdRead {
        Box::pin(async { Err(std::io::Error::other("nothing archived")) })
    }

    fn s3_end(&self, _: u32) -> Option<DurableEnd> {
        *self.s3_end_at_open.lock().expect("lock")
    }

    fn archived_lsn(&self, _: u32) -> Lsn {
        Lsn::new(self.archived.load(Ordering::SeqCst))
    }

    fn put_wal(&self, _: u32, object: WalObject) -> WalPut {
        if self.puts_succeed.load(Ordering::SeqCst) {
            self.in_s3
                .fetch_max(object.last_lsn.get(), Ordering::SeqCst);
            Box::pin(std::future::ready(Ok(())))
        } else {
            Box::pin(std::future::pending())
        }
    }
}

fn s3_config(dir: &std::path::Path, store: &Arc<WalOnlyStore>) -> ShardConfig {
    let mut cfg = ShardConfig::new(0, Durability::Disk(dir.to_path_buf()));
    cfg.tiny_segments = true;
    cfg.checkpoint_bytes = u64::MAX;
    cfg.cold = Some(store.clone());
    cfg.s3_wal = Some(S3WalSettings {
        ack_timeout: Duration::from_millis(200),
        ..S3WalSettings::default()
    });
    cfg
}

fn text_stream(key: &str) -> NewStream {
    NewStream {
        meta: StreamMeta {
            key: key.into(),
            incarnation: 1,
            created_ms: 1,
            content_type: "text/plain".into(),
            lifetime: Lifetime::Forever,
            ext: Bytes::new(),
        },
        initial: AppendRec::default(),
    }
}

fn data(bytes: &'static [u8]) -> AppendRec {
    AppendRec {
        append_lens: vec![bytes.len() as u32],
        msg_lens: vec![bytes.len() as u32],
        data: Bytes::from_static(bytes),
        ..AppendRec::default()
    }
}

fn visible(shard: &Shard, key: &str) -> Option<Offset> {
    let id = shard.lookup(key)?;
    shard.state(id).map(|s| s.visible_tail)
}

#[test]
fn a_recovered_tail_s3_never_had_stays_unreadable_until_the_archive_covers_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Arc::new(WalOnlyStore::default());
    store.puts_succeed.store(true, Ordering::SeqCst);
    let cfg = s3_config(dir.path(), &store);
    block_on(async {
        let (shard, _) = Shard::open(cfg.clone()).await.expect("open");
        let (a, c) = shard.create(text_stream("a")).expect("create a");
        c.durable().await.expect("in S3");
        let c = shard.append(a, data(b"acked")).expect("append").1;
        c.durable().await.expect("in S3");
        // S3 stops answering: these are durable locally but never acknowledged.
        store.puts_succeed.store(false, Ordering::SeqCst);
        let c = shard.append(a, data(b"-lost")).expect("append").1;
        assert!(matches!(
            c.durable().await,
            Err(StorageError::NotInS3 { .. })
        ));
        let (_, c) = shard.create(text_stream("b")).expect("create b");
        assert!(c.durable().await.is_err());
        assert_eq!(visible(&shard, "a"), Some(off(5)), "never shown");
        shard.halt().await.expect("halt");
    });
    // The restart (same disk) finds S3 holding the log through the acknowledged changes.
    let in_s3 = Lsn::new(store.in_s3.load(Ordering::SeqCst));
    *store.s3_end_at_open.lock().expect("lock") = Some(DurableEnd {
        segment: SegmentNo::new(1),
        position: 0,
        lsn: in_s3,
    });
    store.puts_succeed.store(true, Ordering::SeqCst);
    block_on(async {
        let (shard, _) = Shard::open(cfg.clone()).await.expect("reopen");
        let a = shard.lookup("a").expect("a");
        assert_eq!(shard.state(a).map(|s| s.tail), Some(off(10)), "recovered");
        assert_eq!(visible(&shard, "a"), Some(off(5)), "only what S3 had");
        assert_eq!(visible(&shard, "b"), Some(off(0)));
        // The archive reaches the recovered end: the gate opens and it all shows.
        store.archived.store(u64::MAX, Ordering::SeqCst);
        let until = Instant::now() + Duration::from_secs(5);
        while visible(&shard, "a") != Some(off(10)) && Instant::now() < until {
            monoio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(visible(&shard, "a"), Some(off(10)));
        // And new changes are acknowledged again.
        let c = shard.append(a, data(b"!")).expect("append").1;
        c.durable().await.expect("in S3");
        assert_eq!(visible(&shard, "a"), Some(off(11)));
        shard.halt().await.expect("halt");
    });
}
