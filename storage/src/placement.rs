//! Which shard holds a key, as fixed when the data dir was created.
//!
//! A data dir places every stream (and bucket record) on one shard by hashing its storage
//! key. The rule is written down once, in `<data-dir>/ursula.layout` (and in the archive's
//! `layout.json`), because a different rule would look for existing streams on the wrong
//! shard.
//!
//! ```text
//! shards=<N>                 placed by FNV-1a of the key mod N (data dirs from before lanes)
//! shards=<N>\nlanes=<L>\n    lane = CRC32C(key) mod L, shard = lane mod N
//! ```
//!
//! Lanes are what a proxy can compute: HAProxy's `crc32c` and `mod` converters give the
//! same lane from the request path, so a map from lane to a core's own port sends each
//! request to the core that owns its stream (see `docs/operations.md`, "Routing to the
//! owning core").

/// Lanes of a data dir created without choosing a number.
pub const DEFAULT_LANES: u32 = 64;

/// The largest lane count a data dir accepts (a lane map stays small enough to read).
pub const MAX_LANES: u32 = 65_536;

/// How a data dir's keys are placed on its shards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// FNV-1a of the key over the shard count: data dirs created before lanes.
    Hashed { shards: u32 },
    /// `lane = CRC32C(key) mod lanes`, and each lane on shard `lane mod shards`.
    Lanes { shards: u32, lanes: u32 },
}

/// Why a placement was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    #[error("the layout file is not `shards=<N>` optionally followed by `lanes=<L>`")]
    Malformed,
    #[error("{lanes} lanes cannot spread over {shards} shards (need 1 <= shards <= lanes <= {MAX_LANES})")]
    Uneven { shards: u32, lanes: u32 },
}

impl Placement {
    /// The placement of a new data dir: `lanes` lanes over `shards` shards.
    pub fn with_lanes(shards: u32, lanes: u32) -> Result<Placement, PlacementError> {
        if shards == 0 || lanes < shards || lanes > MAX_LANES {
            return Err(PlacementError::Uneven { shards, lanes });
        }
        Ok(Placement::Lanes { shards, lanes })
    }

    /// The placement of `shards` shards and, if any, `lanes` lanes (`None`: the older hash).
    pub fn from_parts(shards: u32, lanes: Option<u32>) -> Result<Placement, PlacementError> {
        match lanes {
            None if shards > 0 => Ok(Placement::Hashed { shards }),
            None => Err(PlacementError::Malformed),
            Some(lanes) => Placement::with_lanes(shards, lanes),
        }
    }

    pub fn shards(&self) -> u32 {
        match *self {
            Placement::Hashed { shards } | Placement::Lanes { shards, .. } => shards,
        }
    }

    /// The lane count, or `None` for a data dir placed by the older hash.
    pub fn lanes(&self) -> Option<u32> {
        match *self {
            Placement::Hashed { .. } => None,
            Placement::Lanes { lanes, .. } => Some(lanes),
        }
    }

    /// The lane of `key`, or `None` for a data dir placed by the older hash.
    pub fn lane_of(&self, key: &str) -> Option<u32> {
        self.lanes()
            .map(|lanes| crc32c::crc32c(key.as_bytes()) % lanes)
    }

    /// The shard that holds `key`.
    pub fn shard_of(&self, key: &str) -> usize {
        match *self {
            Placement::Hashed { shards } => (fnv1a(key) % u64::from(shards)) as usize,
            Placement::Lanes { shards, lanes } => {
                (crc32c::crc32c(key.as_bytes()) % lanes % shards) as usize
            }
        }
    }

    /// The shard that holds lane `lane` (`None` for the older hash, which has no lanes).
    pub fn shard_of_lane(&self, lane: u32) -> Option<usize> {
        match *self {
            Placement::Hashed { .. } => None,
            Placement::Lanes { shards, .. } => Some((lane % shards) as usize),
        }
    }

    /// The text of `ursula.layout`.
    pub fn to_layout_text(&self) -> String {
        match *self {
            Placement::Hashed { shards } => format!("shards={shards}\n"),
            Placement::Lanes { shards, lanes } => format!("shards={shards}\nlanes={lanes}\n"),
        }
    }

    /// Parse the text of `ursula.layout`.
    pub fn from_layout_text(text: &str) -> Result<Placement, PlacementError> {
        let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
        let number = |line: Option<&str>, name: &str| -> Result<Option<u32>, PlacementError> {
            match line {
                None => Ok(None),
                Some(l) => l
                    .strip_prefix(name)
                    .and_then(|v| v.strip_prefix('='))
                    .and_then(|v| v.parse().ok())
                    .map(Some)
                    .ok_or(PlacementError::Malformed),
            }
        };
        let shards = number(lines.next(), "shards")?.ok_or(PlacementError::Malformed)?;
        let lanes = number(lines.next(), "lanes")?;
        if lines.next().is_some() {
            return Err(PlacementError::Malformed);
        }
        Placement::from_parts(shards, lanes)
    }
}

impl std::fmt::Display for Placement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Placement::Hashed { shards } => write!(f, "{shards} shards placed by the older hash"),
            Placement::Lanes { shards, lanes } => write!(f, "{shards} shards of {lanes} lanes"),
        }
    }
}

fn fnv1a(key: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.as_bytes() {
        h ^= *b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lanes_match_the_crc32c_haproxy_computes() {
        // HAProxy 2.6: `str(/b/a b/c),crc32c` printed 2382167506; `mod(64)` of it is 18.
        let p = Placement::with_lanes(2, 64).unwrap();
        assert_eq!(crc32c::crc32c(b"/b/a b/c"), 2_382_167_506);
        assert_eq!(p.lane_of("/b/a b/c"), Some(18));
        assert_eq!(p.shard_of("/b/a b/c"), 0);
        assert_eq!(p.shard_of_lane(19), Some(1));
    }

    #[test]
    fn the_older_hash_is_unchanged() {
        // Data dirs created before lanes must find their streams where they put them.
        let p = Placement::Hashed { shards: 2 };
        assert_eq!(fnv1a(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a("a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(p.shard_of("a"), (0xaf63_dc4c_8601_ec8c_u64 % 2) as usize);
        assert_eq!(p.lane_of("a"), None);
        assert_eq!(p.shard_of_lane(3), None);
    }

    #[test]
    fn every_lane_of_a_shard_holds_its_keys() {
        let p = Placement::with_lanes(3, 64).unwrap();
        for i in 0..1000 {
            let key = format!("b/bucket/stream-{i}");
            let lane = p.lane_of(&key).unwrap();
            assert!(lane < 64);
            assert_eq!(p.shard_of_lane(lane), Some(p.shard_of(&key)));
        }
    }

    #[test]
    fn layout_text_round_trips() {
        for p in [
            Placement::Hashed { shards: 4 },
            Placement::with_lanes(2, 64).unwrap(),
            Placement::with_lanes(1, 1).unwrap(),
        ] {
            assert_eq!(Placement::from_layout_text(&p.to_layout_text()), Ok(p));
        }
        // What servers before lanes wrote, trailing newline or not.
        assert_eq!(
            Placement::from_layout_text("shards=2"),
            Ok(Placement::Hashed { shards: 2 })
        );
    }

    #[test]
    fn bad_layouts_are_refused() {
        for text in [
            "",
            "shards=0\n",
            "shards=x\n",
            "lanes=64\n",
            "shards=2\nlanes=64\nmore=1\n",
            "shards=2\nlane=64\n",
        ] {
            assert_eq!(
                Placement::from_layout_text(text),
                Err(PlacementError::Malformed),
                "{text:?}"
            );
        }
        assert_eq!(
            Placement::from_layout_text("shards=4\nlanes=2\n"),
            Err(PlacementError::Uneven {
                shards: 4,
                lanes: 2
            })
        );
        assert!(Placement::with_lanes(1, MAX_LANES + 1).is_err());
    }
}
