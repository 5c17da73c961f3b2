//! Server-owned per-stream state stored durably next to the stream by the engine: fork
//! linkage, the references that keep a deleted fork source soft-deleted, and stream
//! attributes.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::attrs::Attrs;

#[derive(Serialize, Deserialize, Default, Clone, Debug, PartialEq, Eq)]
pub struct Ext {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fork: Option<ForkLink>,
    /// Live forks created from this stream before forks carried tokens (a plain count).
    #[serde(default)]
    pub refs: u32,
    /// The tokens of the live forks' references that carry one (every fork made since):
    /// giving one back twice, or taking it again, changes nothing.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ref_tokens: Vec<u64>,
    /// Tokens given back before their reference was taken (a fork on another host gave up
    /// while its call was still on its way here): a take that arrives later is refused.
    /// The newest [`MAX_EARLY_RELEASES`] are kept.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub released_early: Vec<u64>,
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
    /// The token of the reference this fork holds on its source (none for forks made
    /// before tokens, which give back a plain count).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<u64>,
}

/// How many early-released tokens a source keeps (see [`Ext::released_early`]): a take
/// arrives within a call's timeout of its give-back, so a few are plenty.
pub const MAX_EARLY_RELEASES: usize = 32;

/// What taking a fork's reference on its source did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Taken {
    /// Counted now.
    New,
    /// This token already held a reference (a repeated take).
    Already,
    /// The token was given back before it got here: nothing taken.
    GivenBack,
}

/// What giving a fork's reference back did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Released {
    /// One reference fewer.
    Dropped,
    /// Nothing held under this token (not yet taken, or already given back).
    NotHeld,
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

    /// Whether live forks still reference this stream.
    pub fn referenced(&self) -> bool {
        self.refs > 0 || !self.ref_tokens.is_empty()
    }

    /// Take a reference for a fork, under `token` if it has one.
    pub fn take_ref(&mut self, token: Option<u64>) -> Taken {
        let Some(t) = token else {
            self.refs += 1;
            return Taken::New;
        };
        if self.released_early.contains(&t) {
            return Taken::GivenBack;
        }
        if self.ref_tokens.contains(&t) {
            return Taken::Already;
        }
        self.ref_tokens.push(t);
        Taken::New
    }

    /// Give back a fork's reference, under `token` if it has one. A token not held is
    /// remembered, so the take it belongs to is refused should it arrive after this.
    pub fn release_ref(&mut self, token: Option<u64>) -> Released {
        let Some(t) = token else {
            self.refs = self.refs.saturating_sub(1);
            return Released::Dropped;
        };
        if let Some(i) = self.ref_tokens.iter().position(|&held| held == t) {
            self.ref_tokens.swap_remove(i);
            return Released::Dropped;
        }
        if !self.released_early.contains(&t) {
            if self.released_early.len() >= MAX_EARLY_RELEASES {
                self.released_early.remove(0);
            }
            self.released_early.push(t);
        }
        Released::NotHeld
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
                token: Some(77),
            }),
            refs: 2,
            ref_tokens: vec![5, 6],
            released_early: vec![8],
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

    #[test]
    fn a_token_is_taken_once_and_given_back_once() {
        let mut e = Ext::default();
        assert_eq!(e.take_ref(Some(1)), Taken::New);
        assert_eq!(e.take_ref(Some(1)), Taken::Already);
        assert_eq!(e.take_ref(Some(2)), Taken::New);
        assert!(e.referenced());
        assert_eq!(e.release_ref(Some(1)), Released::Dropped);
        assert_eq!(e.release_ref(Some(1)), Released::NotHeld);
        assert!(e.referenced(), "token 2 still holds one");
        assert_eq!(e.release_ref(Some(2)), Released::Dropped);
        assert!(!e.referenced());
    }

    #[test]
    fn a_take_after_its_give_back_is_refused() {
        let mut e = Ext::default();
        assert_eq!(e.release_ref(Some(9)), Released::NotHeld);
        assert_eq!(e.take_ref(Some(9)), Taken::GivenBack);
        assert!(!e.referenced());
        for t in 100..100 + MAX_EARLY_RELEASES as u64 + 5 {
            e.release_ref(Some(t));
        }
        assert_eq!(e.released_early.len(), MAX_EARLY_RELEASES);
        assert_eq!(e.take_ref(Some(9)), Taken::New, "only the newest are kept");
    }

    #[test]
    fn forks_without_tokens_keep_counting() {
        let mut e = Ext::decode(&Bytes::from_static(br#"{"refs":2}"#));
        assert_eq!(e.take_ref(None), Taken::New);
        assert_eq!(e.refs, 3);
        for _ in 0..3 {
            assert_eq!(e.release_ref(None), Released::Dropped);
        }
        assert!(!e.referenced());
        assert_eq!(e.release_ref(None), Released::Dropped, "never below zero");
        assert_eq!(e.refs, 0);
    }
}
