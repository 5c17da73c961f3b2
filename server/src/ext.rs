//! Server-owned per-stream state stored durably next to the stream by the engine: fork
//! linkage, the reference count that keeps a deleted fork source soft-deleted, and stream
//! attributes.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::attrs::Attrs;

#[derive(Serialize, Deserialize, Default, Clone, Debug, PartialEq, Eq)]
pub struct Ext {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fork: Option<ForkLink>,
    /// Live forks created from this stream.
    #[serde(default)]
    pub refs: u32,
    /// Deleted by a client but kept because forks still reference it.
    #[serde(default)]
    pub soft_deleted: bool,
    /// Stream attributes (extensions.md §7); `None` ≡ `{}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attrs: Option<Attrs>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct ForkLink {
    /// Storage key of the source stream.
    pub source: String,
    pub source_incarnation: u64,
    /// `Stream-Fork-Offset` as requested (None: the source tail at creation).
    pub offset: Option<u64>,
    pub sub_offset: u64,
}

impl Ext {
    pub fn decode(raw: &Bytes) -> Ext {
        if raw.is_empty() {
            return Ext::default();
        }
        sonic_rs::from_slice(raw).unwrap_or_else(|e| {
            tracing::error!("unreadable stream ext state ({e}); treating as empty");
            Ext::default()
        })
    }

    /// Whether a stream is soft-deleted, without decoding the blob in the common case:
    /// the encoder writes the flag as `"soft_deleted":true`, so a blob without those bytes
    /// is not soft-deleted (bytes inside an attribute value only cost a full decode).
    pub fn is_soft_deleted(raw: &[u8]) -> bool {
        memchr::memmem::find(raw, br#""soft_deleted":true"#).is_some()
            && Ext::decode(&Bytes::copy_from_slice(raw)).soft_deleted
    }

    pub fn encode(&self) -> Bytes {
        if *self == Ext::default() {
            return Bytes::new();
        }
        Bytes::from(sonic_rs::to_vec(self).unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_and_empty_default() {
        assert_eq!(Ext::decode(&Bytes::new()), Ext::default());
        assert!(Ext::default().encode().is_empty());
        let e = Ext {
            fork: Some(ForkLink {
                source: "c/src".into(),
                source_incarnation: 9,
                offset: Some(3),
                sub_offset: 1,
            }),
            refs: 2,
            soft_deleted: true,
            attrs: None,
        };
        assert_eq!(Ext::decode(&e.encode()), e);
        assert!(Ext::is_soft_deleted(&e.encode()));
        let live = Ext {
            soft_deleted: false,
            ..e
        };
        assert!(!Ext::is_soft_deleted(&live.encode()));
        assert!(!Ext::is_soft_deleted(&Bytes::new()));
    }

    #[test]
    fn ext_roundtrip_keeps_old_blobs_readable() {
        let old = bytes::Bytes::from_static(br#"{"refs":1,"soft_deleted":false}"#);
        let e = Ext::decode(&old);
        assert_eq!(e.attrs, None);
        assert_eq!(e.refs, 1);
        let e = Ext {
            attrs: crate::attrs::parse(br#"{"title":"t","metadata":{"a":"\n"}}"#).unwrap(),
            ..Default::default()
        };
        assert_eq!(Ext::decode(&e.encode()), e);
    }
}
