//! Which shard holds a key, as fixed when the data dir was created.
//!
//! A data dir places every stream (and bucket record) on one shard by hashing its storage
//! key. The rule is written down once, in `<data-dir>/ursula.layout` (and in the archive's
//! `layout.json`), because a different rule would look for existing streams on the wrong
//! shard.
//!
//! ```text
//! shards=<N>                            placed by FNV-1a of the key mod N (data dirs from before lanes)
//! shards=<N>\nlanes=<L>\n               lane = CRC32C(key) mod L, shard = lane mod N: a log per core
//! shards=<L>\nlanes=<L>\nlogs=lane\n    lane = CRC32C(key) mod L, shard = lane: a log per lane
//! ```
//!
//! A shard runs on core `shard mod cores`. With a log per core there is one shard per
//! core, so the core count is fixed with the data dir. With a log per lane every lane is a
//! log of its own, which is what a cluster moves between hosts (`docs/cluster.md`); a core
//! then runs several, any core count up to the lane count opens the data dir, and stream
//! ids carry their shard ([`Placement::first_id`]) so a core finds a stream's log from
//! its id alone.
//!
//! Lanes are what a proxy can compute: HAProxy's `crc32c` and `mod` converters give the
//! same lane from the request path, so a map from lane to a core's own port sends each
//! request to the core that owns its stream (see `docs/operations.md`, "Routing to the
//! owning core").

/// Lanes of a data dir created without choosing a number.
pub const DEFAULT_LANES: u32 = 64;

/// The largest lane count a data dir accepts (a lane map stays small enough to read).
pub const MAX_LANES: u32 = 65_536;

/// Bits of a stream id below its shard's number, with a log per lane: ids of shard `s`
/// start at `s << 40`, leaving each shard 2^40 ids.
pub const SHARD_ID_SHIFT: u32 = 40;

/// How a data dir's keys are placed on its shards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// FNV-1a of the key over the shard count: data dirs created before lanes.
    Hashed { shards: u32 },
    /// `lane = CRC32C(key) mod lanes`, and each lane on shard `lane mod shards`: a log per
    /// core.
    Lanes { shards: u32, lanes: u32 },
    /// `lane = CRC32C(key) mod lanes`, and each lane a shard of its own: a log per lane.
    LaneLogs { lanes: u32 },
}

/// Why a placement was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    #[error(
        "the layout file is not `shards=<N>` optionally followed by `lanes=<L>` and `logs=lane`"
    )]
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

    /// The placement of a new data dir with a log per lane.
    pub fn lane_logs(lanes: u32) -> Result<Placement, PlacementError> {
        Placement::with_lanes(lanes, lanes)?;
        Ok(Placement::LaneLogs { lanes })
    }

    /// The placement of `shards` shards and, if any, `lanes` lanes (`None`: the older hash),
    /// with a log per lane if `log_per_lane`.
    pub fn from_parts(
        shards: u32,
        lanes: Option<u32>,
        log_per_lane: bool,
    ) -> Result<Placement, PlacementError> {
        match lanes {
            None if shards > 0 && !log_per_lane => Ok(Placement::Hashed { shards }),
            None => Err(PlacementError::Malformed),
            Some(lanes) if log_per_lane && shards != lanes => {
                Err(PlacementError::Uneven { shards, lanes })
            }
            Some(lanes) if log_per_lane => Placement::lane_logs(lanes),
            Some(lanes) => Placement::with_lanes(shards, lanes),
        }
    }

    pub fn shards(&self) -> u32 {
        match *self {
            Placement::Hashed { shards } | Placement::Lanes { shards, .. } => shards,
            Placement::LaneLogs { lanes } => lanes,
        }
    }

    /// The lane count, or `None` for a data dir placed by the older hash.
    pub fn lanes(&self) -> Option<u32> {
        match *self {
            Placement::Hashed { .. } => None,
            Placement::Lanes { lanes, .. } | Placement::LaneLogs { lanes } => Some(lanes),
        }
    }

    /// Whether every lane is a log (shard) of its own.
    pub fn log_per_lane(&self) -> bool {
        matches!(self, Placement::LaneLogs { .. })
    }

    /// Whether `cores` cores can run this data dir: one per shard with a log per core, at
    /// most one per lane with a log per lane.
    pub fn fits_cores(&self, cores: usize) -> bool {
        match *self {
            Placement::LaneLogs { lanes } => (1..=lanes as usize).contains(&cores),
            _ => cores == self.shards() as usize,
        }
    }

    /// The core shard `shard` runs on.
    pub fn core_of_shard(shard: usize, cores: usize) -> usize {
        shard % cores.max(1)
    }

    /// The first stream id shard `shard` hands out: with a log per lane its number is in
    /// the id's top bits ([`SHARD_ID_SHIFT`]), else every shard counts from 1.
    pub fn first_id(&self, shard: u32) -> u64 {
        match *self {
            Placement::LaneLogs { .. } => (u64::from(shard) << SHARD_ID_SHIFT).max(1),
            _ => 1,
        }
    }

    /// The shard that handed out stream id `id`, when ids carry it (a log per lane).
    pub fn shard_of_id(&self, id: u64) -> Option<usize> {
        self.log_per_lane()
            .then_some((id >> SHARD_ID_SHIFT) as usize)
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
            Placement::LaneLogs { lanes } => (crc32c::crc32c(key.as_bytes()) % lanes) as usize,
        }
    }

    /// The shard that holds lane `lane` (`None` for the older hash, which has no lanes).
    pub fn shard_of_lane(&self, lane: u32) -> Option<usize> {
        match *self {
            Placement::Hashed { .. } => None,
            Placement::Lanes { shards, .. } => Some((lane % shards) as usize),
            Placement::LaneLogs { .. } => Some(lane as usize),
        }
    }

    /// The text of `ursula.layout`.
    pub fn to_layout_text(&self) -> String {
        match *self {
            Placement::Hashed { shards } => format!("shards={shards}\n"),
            Placement::Lanes { shards, lanes } => format!("shards={shards}\nlanes={lanes}\n"),
            Placement::LaneLogs { lanes } => format!("shards={lanes}\nlanes={lanes}\nlogs=lane\n"),
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
        let log_per_lane = match lines.next() {
            None => false,
            Some("logs=lane") => true,
            Some(_) => return Err(PlacementError::Malformed),
        };
        if lines.next().is_some() {
            return Err(PlacementError::Malformed);
        }
        Placement::from_parts(shards, lanes, log_per_lane)
    }
}

impl std::fmt::Display for Placement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Placement::Hashed { shards } => write!(f, "{shards} shards placed by the older hash"),
            Placement::Lanes { shards, lanes } => write!(f, "{shards} shards of {lanes} lanes"),
            Placement::LaneLogs { lanes } => write!(f, "{lanes} lanes, a log each"),
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
            Placement::lane_logs(12).unwrap(),
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
            "shards=2\nlogs=lane\n",
            "shards=2\nlanes=64\nlogs=core\n",
            "shards=2\nlanes=64\nlogs=lane\nmore=1\n",
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
        assert_eq!(
            Placement::from_layout_text("shards=2\nlanes=12\nlogs=lane\n"),
            Err(PlacementError::Uneven {
                shards: 2,
                lanes: 12
            })
        );
    }

    #[test]
    fn a_log_per_lane_puts_each_lane_on_its_own_shard() {
        let p = Placement::lane_logs(12).unwrap();
        assert_eq!(p.shards(), 12);
        for i in 0..1000 {
            let key = format!("b/bucket/stream-{i}");
            let lane = p.lane_of(&key).unwrap();
            assert_eq!(p.shard_of(&key), lane as usize);
            assert_eq!(p.shard_of_lane(lane), Some(lane as usize));
        }
        // Any core count up to the lanes runs it; a log per core fixes the count.
        assert!(p.fits_cores(1) && p.fits_cores(5) && p.fits_cores(12));
        assert!(!p.fits_cores(0) && !p.fits_cores(13));
        let per_core = Placement::with_lanes(2, 12).unwrap();
        assert!(per_core.fits_cores(2) && !per_core.fits_cores(3));
        assert_eq!(Placement::core_of_shard(7, 2), 1);
    }

    #[test]
    fn stream_ids_carry_their_shard_with_a_log_per_lane() {
        let p = Placement::lane_logs(64).unwrap();
        assert_eq!(p.first_id(0), 1);
        for shard in [0, 1, 5, 63] {
            let first = p.first_id(shard);
            for id in [first, first + 1, first + (1 << 39)] {
                assert_eq!(p.shard_of_id(id), Some(shard as usize));
            }
        }
        let per_core = Placement::with_lanes(2, 64).unwrap();
        assert_eq!((per_core.first_id(1), per_core.shard_of_id(5)), (1, None));
    }
}
