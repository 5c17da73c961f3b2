//! Every size and rate the storage engine is tuned with, unit-suffixed, each with why it
//! has its value. On-disk format constants (magic numbers, header layouts, versions) stay
//! beside their formats; configuration defaults a server can override stay with
//! [`crate::shard::ShardConfig`].

// Direct I/O.

/// Alignment of every direct-I/O buffer, offset and length.
pub const IO_BLOCK_BYTES: usize = 4096;

/// Buffers at least this large are mapped from the kernel directly and unmapped when
/// dropped. The allocator keeps what it frees for reuse: after recovery read each shard's
/// open 128 MiB segment whole, a server held ~280 MB it would never use again, more than
/// its steady state with millions of appends retained.
pub(crate) const MAPPED_BUF_BYTES_MIN: usize = 16 << 20;

// The log.

/// Standard size of a write batch buffer; a batch that outgrows it takes a bigger one from
/// the pool (up to `POOLED_BUF_BYTES_MAX` of them are kept).
pub(crate) const BATCH_BUF_BYTES: usize = 1 << 20;
/// Most bytes of write buffers a shard keeps for reuse between group commits.
pub(crate) const POOLED_BUF_BYTES_MAX: usize = 32 << 20;
/// How many bytes ahead of the records a slowly filling segment is zeroed at a time (see
/// `Log::zero_ahead`).
pub(crate) const ZERO_AHEAD_BYTES: u64 = 1 << 20;
/// How fast a spare segment is zero-filled: a 128 MiB segment in about 1 s.
pub(crate) const SPARE_ZERO_BYTES_PER_SEC: f64 = 128e6;

// Reading back from segments.

/// A gap of unwanted bytes up to this size between two wanted records is read through: it
/// costs less than another read's latency on the disks we run on (~60 us at 1.5 GB/s).
pub(crate) const READ_GAP_BYTES_MAX: u64 = 32 << 10;
/// Largest span read at once (a longer record is still read whole, alone).
pub(crate) const READ_SPAN_BYTES_MAX: u64 = 1 << 20;
/// Reads of one response in flight at once, and the bytes they may hold.
pub(crate) const READS_IN_FLIGHT_MAX: usize = 8;
pub(crate) const READ_IN_FLIGHT_BYTES_MAX: u64 = 4 << 20;

// The read cache.

/// Appends up to this size are packed into blocks; larger ones are cached as they came
/// (their piece is already big enough that its bookkeeping does not matter).
pub(crate) const CACHE_PACK_BYTES_MAX: usize = 8 << 10;
/// Largest packed block. A replay of a few hundred KiB is a handful of pieces, while a
/// stream's open block (grown by doubling from `CACHE_BLOCK_BYTES_MIN`) stays small next
/// to the cache.
pub(crate) const CACHE_BLOCK_BYTES_MAX: usize = 64 << 10;
/// Smallest open block. Blocks start at the first append's size rounded up to a power of
/// two, so an open block larger than this is never more than half empty: a server with
/// 100k streams that each received one small append holds about that much, not 100k
/// whole blocks.
pub(crate) const CACHE_BLOCK_BYTES_MIN: usize = 256;

// Stream tables and index files.

/// Entries per frozen block of a packed table: a lookup decodes at most this many.
pub(crate) const PACKED_BLOCK_ENTRIES: usize = 64;
/// Entries a table's unpacked tail grows by when it is full. Small, so that a stream that
/// stops inside a block holds little unused capacity; the copies it costs stay within a
/// block's worth of entries.
pub(crate) const PACKED_TAIL_GROWTH_ENTRIES: usize = 8;
/// Blocks per page: the unit that moves to an index file, with one entry left in memory.
/// (Tests use fewer, so that small histories already span several pages.)
pub(crate) const PACKED_PAGE_BLOCKS: usize = if cfg!(test) { 4 } else { 16 };
/// Bytes of completed pages a shard gathers in memory before it writes them out as an index
/// file (checked once a second by the upkeep task). Streams that grow at one pace complete
/// their pages together: at 500 streams of 256 B appends per core, a wave of 500 pages
/// (3.4 MB) every few seconds, two waves per 128 MiB segment, so each wave is one file.
/// (Tests use less, so that small histories already write several files.)
pub(crate) const INDEX_FLUSH_BYTES: usize = if cfg!(test) { 4 << 10 } else { 1 << 20 };

// Upkeep: checkpoints and dormancy.

/// Bytes of a checkpoint or an index file handed to the kernel in one buffered write: its
/// copy into the page cache runs on the core's thread (about a quarter of a millisecond).
pub(crate) const SYNCED_WRITE_PIECE_BYTES: usize = 1 << 20;
/// Bytes a checkpoint or a round of dormant states encodes between two chances for the
/// core's requests to run (about a tenth of a millisecond of copying and checksumming).
pub(crate) const ENCODE_SLICE_BYTES: usize = 256 << 10;
/// Resident streams a checkpoint captures between two chances for the core's requests to
/// run (each an image and its tables' newest entries: a few microseconds). (Tests use
/// fewer, so that a few streams already take several slices.)
pub(crate) const CAPTURES_PER_SLICE: usize = if cfg!(test) { 2 } else { 512 };
/// Most streams one upkeep round puts to sleep: bounds the round's file and the catalog
/// work between two chances for requests to run.
pub(crate) const SLEEPERS_PER_ROUND_MAX: usize = 100_000;
/// Streams a round turns dormant between two chances for requests to run: bounds how
/// long dropping their states holds the core.
pub(crate) const SLEEPS_PER_SLICE: usize = 1024;
/// Milliseconds between two index files written only to put streams to sleep (pages due,
/// a roll or a checkpoint write one sooner), unless the last one put at least
/// [`EAGER_SLEEPERS`] to sleep: a trickle of streams going idle, one a second, would
/// otherwise leave one small file per second, each held open as long as one of its
/// streams sleeps.
pub(crate) const SLEEP_ONLY_FILE_INTERVAL_MS: i64 = if cfg!(test) { 0 } else { 10_000 };
/// Streams put to sleep by one file above which the next may follow at once.
pub(crate) const EAGER_SLEEPERS: usize = 256;
/// Index files a shard keeps open before compaction merges the small ones (below
/// [`SMALL_INDEX_FILE_BYTES`]): their dormant states move into the next file. High, so
/// that it bounds open descriptors over weeks without churning: under a load that creates
/// streams without pause every round writes a file, and a soft limit of 256 had
/// compaction wake thousands of streams every round.
pub(crate) const INDEX_FILES_SOFT_MAX: usize = if cfg!(test) { 8 } else { 4096 };
/// An index file this small is merged once there are more than [`INDEX_FILES_SOFT_MAX`].
pub(crate) const SMALL_INDEX_FILE_BYTES: u64 = 1 << 20;
/// Dormant states compaction moves in one upkeep round (each read back, then saved again
/// in the next file: a few hundred bytes and about ten microseconds apiece; the woken
/// streams are resident until the next round puts them back to sleep).
pub(crate) const STATE_MOVES_PER_ROUND: usize = if cfg!(test) { 64 } else { 1024 };
/// Dormant states compaction wakes between two chances for the core's requests to run.
pub(crate) const STATE_MOVES_PER_SLICE: usize = if cfg!(test) { 4 } else { 64 };
/// Unused index files (nothing points into them) that make a checkpoint due, so they can
/// be deleted (a file goes once a checkpoint that does not name it is installed).
pub(crate) const UNUSED_INDEX_FILES_CHECKPOINT: usize = if cfg!(test) { 4 } else { 32 };

// The cold tier.

/// Cold segments are fetched in aligned blocks of this size (smaller segments whole): large
/// enough that a catch-up reader needs few requests (S3 charges per GET, and its first byte
/// takes tens of milliseconds), small enough that a single-record read does not fetch much.
pub const COLD_BLOCK_BYTES: u64 = 1 << 20;
/// Stream bytes after a cold read whose blocks are fetched ahead of the reader, and the most
/// blocks one read sets off that way.
pub(crate) const COLD_READAHEAD_BYTES: u64 = 4 << 20;
pub(crate) const COLD_READAHEAD_BLOCKS_MAX: usize = 4;
/// A cold read at least this long, or one that starts where the stream's previous cold
/// read ended, is taken for catch-up reading and sets off readahead. Random small reads do
/// not: each would fetch `COLD_READAHEAD_BYTES` it never reads.
pub(crate) const COLD_SEQUENTIAL_READ_BYTES: u64 = 256 << 10;
/// Streams whose last cold read's end is remembered; past that, the memory starts over.
pub(crate) const COLD_TRACKED_READERS_MAX: usize = 4096;
