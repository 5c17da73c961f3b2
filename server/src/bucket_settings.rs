//! A bucket's settings: how a `POST` to a missing stream of the bucket creates it
//! (`auto_create`), and how fast the bucket's streams may be appended to (`rate_limit`).
//!
//! They are a JSON object, sent as the body of `PUT /{bucket}` or `PATCH /{bucket}`, and
//! kept as the `ext` blob of the bucket's record, which every shard holds (see
//! `handlers::buckets`): the core that owns a stream reads them from its own copy.

use serde::{Deserialize, Serialize};
use ursula_protocol::content_type::{is_text, non_utf8_charset, normalize};

/// Everything a bucket can be set to. Both parts are optional; a bucket without settings
/// behaves as buckets always have (a missing stream is a 404, appends are unlimited).
#[derive(Serialize, Deserialize, Default, Clone, Debug, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct BucketSettings {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_create: Option<AutoCreate>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<RateLimit>,
}

/// How a missing stream is created by its first append.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct AutoCreate {
    /// The new stream's content type (normalised when the settings are accepted).
    pub content_type: String,
    /// The new stream's `Stream-TTL`: it expires this long after its last write.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_seconds: Option<u64>,
}

/// The bucket's token buckets: a sustained rate and the burst above it, for appends and
/// for appended bytes. Either pair may be left out; a burst left out is one second's worth.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RateLimit {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub appends_per_sec: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub appends_burst: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_per_sec: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_burst: Option<u64>,
}

/// A change to a bucket's settings (`PATCH`): each part given replaces the bucket's, each
/// part given as `null` removes it, each part left out stays as it is.
#[derive(Deserialize, Default, Debug)]
#[serde(deny_unknown_fields)]
pub struct SettingsPatch {
    #[serde(default, deserialize_with = "present")]
    auto_create: Option<Option<AutoCreate>>,
    #[serde(default, deserialize_with = "present")]
    rate_limit: Option<Option<RateLimit>>,
}

/// Why a settings body was refused; the message is the 400's reason.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum SettingsError {
    #[error("bucket settings are not a JSON object of known settings: {0}")]
    Syntax(String),
    #[error("auto_create.content_type is not a valid content type")]
    ContentType,
    #[error("auto_create.content_type: text streams hold UTF-8 only")]
    Charset,
    #[error("auto_create.ttl_seconds must be from 1 to 100 years of seconds")]
    Ttl,
    #[error("rate_limit must set appends_per_sec or bytes_per_sec")]
    NoRate,
    #[error("rate_limit.{0} must be from 1 to 1000000000000")]
    OutOfRange(&'static str),
    #[error("rate_limit.{0} needs its {1}")]
    BurstWithoutRate(&'static str, &'static str),
}

/// The longest TTL a created stream may get: 100 years, far inside what the engine's
/// millisecond deadlines hold.
pub const MAX_TTL_SECONDS: u64 = 100 * 365 * 24 * 3600;

/// The largest rate or burst accepted: far above any real one, and small enough that the
/// limiter's nanosecond arithmetic cannot overflow (see `rate_limit`).
pub const MAX_RATE: u64 = 1_000_000_000_000;

impl BucketSettings {
    /// The settings in the body of a `PUT /{bucket}`; an empty body is no settings.
    pub fn parse(body: &[u8]) -> Result<BucketSettings, SettingsError> {
        if body.iter().all(u8::is_ascii_whitespace) {
            return Ok(BucketSettings::default());
        }
        let s: BucketSettings =
            sonic_rs::from_slice(body).map_err(|e| SettingsError::Syntax(short(&e)))?;
        s.checked()
    }

    /// These settings with `patch` applied, checked.
    pub fn patched(&self, body: &[u8]) -> Result<BucketSettings, SettingsError> {
        let p: SettingsPatch =
            sonic_rs::from_slice(body).map_err(|e| SettingsError::Syntax(short(&e)))?;
        let mut s = self.clone();
        if let Some(a) = p.auto_create {
            s.auto_create = a;
        }
        if let Some(r) = p.rate_limit {
            s.rate_limit = r;
        }
        s.checked()
    }

    /// The settings kept in a bucket record's `ext` blob. Settings stored by this server
    /// were checked when they were accepted; a blob that does not decode (written by a
    /// later version) is logged and read as no settings rather than refusing the bucket.
    pub fn decode(raw: &[u8]) -> BucketSettings {
        if raw.is_empty() {
            return BucketSettings::default();
        }
        sonic_rs::from_slice(raw).unwrap_or_else(|e| {
            tracing::error!("unreadable bucket settings ({e}); treating as none");
            BucketSettings::default()
        })
    }

    pub fn encode(&self) -> Vec<u8> {
        if *self == BucketSettings::default() {
            return Vec::new();
        }
        sonic_rs::to_vec(self).unwrap_or_default()
    }

    fn checked(mut self) -> Result<BucketSettings, SettingsError> {
        if let Some(a) = &mut self.auto_create {
            let ct = normalize(&a.content_type).map_err(|_| SettingsError::ContentType)?;
            if is_text(&ct) && non_utf8_charset(&ct).is_some() {
                return Err(SettingsError::Charset);
            }
            a.content_type = ct;
            if a.ttl_seconds
                .is_some_and(|t| !(1..=MAX_TTL_SECONDS).contains(&t))
            {
                return Err(SettingsError::Ttl);
            }
        }
        if let Some(r) = &self.rate_limit {
            r.check()?;
        }
        Ok(self)
    }
}

impl RateLimit {
    fn check(&self) -> Result<(), SettingsError> {
        if self.appends_per_sec.is_none() && self.bytes_per_sec.is_none() {
            return Err(SettingsError::NoRate);
        }
        let fields = [
            ("appends_per_sec", self.appends_per_sec),
            ("appends_burst", self.appends_burst),
            ("bytes_per_sec", self.bytes_per_sec),
            ("bytes_burst", self.bytes_burst),
        ];
        for (name, v) in fields {
            if v.is_some_and(|v| v == 0 || v > MAX_RATE) {
                return Err(SettingsError::OutOfRange(name));
            }
        }
        if self.appends_burst.is_some() && self.appends_per_sec.is_none() {
            return Err(SettingsError::BurstWithoutRate(
                "appends_burst",
                "appends_per_sec",
            ));
        }
        if self.bytes_burst.is_some() && self.bytes_per_sec.is_none() {
            return Err(SettingsError::BurstWithoutRate(
                "bytes_burst",
                "bytes_per_sec",
            ));
        }
        Ok(())
    }
}

/// A patch part that is present (even as `null`) is `Some`.
fn present<'de, T, D>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    T: Deserialize<'de>,
    D: serde::Deserializer<'de>,
{
    Option::<T>::deserialize(d).map(Some)
}

/// The decoder's message without the excerpt of the input it quotes: the reason goes into a
/// one-line plain-text answer.
fn short(e: &sonic_rs::Error) -> String {
    let text = e.to_string();
    let first = text.lines().next().unwrap_or("");
    first.chars().take(160).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_normalises_and_round_trips() {
        let s = BucketSettings::parse(
            br#"{"auto_create":{"content_type":"Application/JSON","ttl_seconds":172800},
                 "rate_limit":{"appends_per_sec":100,"bytes_per_sec":1048576,"bytes_burst":4194304}}"#,
        )
        .expect("valid");
        let a = s.auto_create.as_ref().expect("auto_create");
        assert_eq!(a.content_type, "application/json");
        assert_eq!(a.ttl_seconds, Some(172800));
        assert_eq!(BucketSettings::decode(&s.encode()), s);
        assert_eq!(
            BucketSettings::parse(b"").expect("empty"),
            BucketSettings::default()
        );
        assert!(BucketSettings::default().encode().is_empty());
    }

    #[test]
    fn bad_settings_are_refused() {
        let refused = |body: &str| BucketSettings::parse(body.as_bytes()).err();
        assert!(matches!(refused("{"), Some(SettingsError::Syntax(_))));
        assert!(matches!(
            refused(r#"{"auto":{}}"#),
            Some(SettingsError::Syntax(_))
        ));
        assert_eq!(
            refused(r#"{"auto_create":{"content_type":"not a type"}}"#),
            Some(SettingsError::ContentType)
        );
        assert_eq!(
            refused(r#"{"auto_create":{"content_type":"text/plain; charset=latin1"}}"#),
            Some(SettingsError::Charset)
        );
        assert_eq!(
            refused(r#"{"auto_create":{"content_type":"text/plain","ttl_seconds":0}}"#),
            Some(SettingsError::Ttl)
        );
        assert_eq!(refused(r#"{"rate_limit":{}}"#), Some(SettingsError::NoRate));
        assert_eq!(
            refused(r#"{"rate_limit":{"appends_per_sec":0}}"#),
            Some(SettingsError::OutOfRange("appends_per_sec"))
        );
        assert_eq!(
            refused(r#"{"rate_limit":{"appends_per_sec":5,"bytes_burst":9}}"#),
            Some(SettingsError::BurstWithoutRate(
                "bytes_burst",
                "bytes_per_sec"
            ))
        );
        assert!(matches!(
            refused(r#"{"rate_limit":{"appends_per_sec":-1}}"#),
            Some(SettingsError::Syntax(_))
        ));
    }

    #[test]
    fn patch_replaces_removes_and_keeps() {
        let s = BucketSettings::parse(
            br#"{"auto_create":{"content_type":"text/plain"},
                 "rate_limit":{"appends_per_sec":5,"bytes_per_sec":1000}}"#,
        )
        .expect("valid");
        let p = s
            .patched(br#"{"rate_limit":{"appends_per_sec":9}}"#)
            .expect("patch");
        assert_eq!(p.auto_create, s.auto_create);
        assert_eq!(p.rate_limit.and_then(|r| r.appends_per_sec), Some(9));
        // A part is replaced whole, as docs/api.md says: not merged member by member.
        assert_eq!(p.rate_limit.and_then(|r| r.bytes_per_sec), None);
        let p = p.patched(br#"{"auto_create":null}"#).expect("patch");
        assert_eq!(p.auto_create, None);
        assert!(p.rate_limit.is_some());
        assert!(p
            .patched(br#"{"rate_limit":{"appends_per_sec":0}}"#)
            .is_err());
    }
}
