//! Every limit and fixed size of the server, unit-suffixed, each with why it has its value.
//!
//! The read ceiling of one response (`MAX_READ_BYTES`), the request-head ceiling and the
//! append-batch frame count are wire rules and live in the protocol crate; the storage
//! engine's sizes live in the storage crate. Nothing here repeats them.

use std::time::Duration;

/// Largest request body (PUT/POST) other than a snapshot publish. Big enough for a full
/// append batch (512 frames) of ordinary telemetry records.
pub const BODY_BYTES_MAX: u64 = 32 << 20;
/// Largest snapshot body (protocol.md §4.7): a snapshot folds a whole history.
pub const SNAPSHOT_BODY_BYTES_MAX: u64 = 128 << 20;
/// Update bytes one bootstrap response carries at most (whole messages, at least one).
pub const BOOTSTRAP_UPDATE_BYTES_MAX: u64 = 64 << 20;
/// Largest stream-attribute document (header value or body).
pub const ATTRS_BYTES_MAX: usize = 16 * 1024;

/// Compat stream IDs (P§1.2): at most 1024 bytes of UTF-8.
pub const COMPAT_ID_BYTES_MAX: usize = 1024;
/// Bucket IDs (extensions §1.1): 4-64 characters.
pub const BUCKET_ID_BYTES_MIN: usize = 4;
pub const BUCKET_ID_BYTES_MAX: usize = 64;
/// `{bucket}/{stream}` of a bucketed stream (extensions §1.1).
pub const BUCKETED_NAME_BYTES_MAX: usize = 122;
/// Entries one listing page returns at most (the streams of a bucket, or the buckets), and
/// its default page size.
pub const LIST_PAGE_MAX: usize = 1000;

/// Connections of the whole process by default (`max_connections`), split over the cores.
pub const CONNECTIONS_MAX_DEFAULT: usize = 10_000;
/// Bytes a connection asks the socket for per read.
pub const READ_CHUNK_BYTES: usize = 16 * 1024;
/// Most of a `Content-Length` body reserved before its bytes arrive; a larger body grows as
/// it is received, so a client that announces 32 MiB and sends little holds little. 4 MiB
/// covers full append batches (512 frames of a few KiB) in one allocation: at 1 MiB, the
/// regrowth copy of every just-over-1-MiB batch was 8% of a large-batch ingest's CPU.
pub const BODY_RESERVE_BYTES_MAX: usize = 4 << 20;
/// The first buffer of a body sent compressed is its compressed length times this
/// (telemetry JSON shrinks 5-15 times), at least `DECODED_BODY_FIRST_BYTES_MIN` and at most
/// `DECODED_BODY_DOUBLING_BYTES_MAX`.
pub const DECODED_BODY_FIRST_RATIO: u64 = 4;
pub const DECODED_BODY_FIRST_BYTES_MIN: usize = 16 * 1024;
/// A decoded body's buffer doubles up to this size; past it, it is reserved at the body
/// limit at once, so a large body is copied once (at most this much) instead of at every
/// doubling, and never holds an old and a new buffer of tens of MiB together.
pub const DECODED_BODY_DOUBLING_BYTES_MAX: usize = 1 << 20;
/// Largest window a zstd body may ask for, as a power of two: 8 MiB, what zstd levels 1-19
/// use. Frames made with `--long` or `--ultra` ask for more and are refused, rather than
/// have a small body make the decoder allocate up to 2 GiB.
pub const ZSTD_WINDOW_LOG_MAX: u32 = 23;
/// Request-body bytes each core may be receiving at once by default (`body_budget_bytes`):
/// eight full-size appends, so a few slow or stalled uploads cannot hold the core's memory.
pub const BODY_BUDGET_BYTES_DEFAULT: usize = 256 << 20;
/// Requests in a row for streams of one other core before a connection moves there. More
/// than one, so a connection that alternates between cores' streams stays put.
pub const MOVE_AFTER_REQUESTS: u32 = 4;
/// A refused connection (over the cap) is drained for at most this many bytes and this
/// long after its 503, so the answer arrives before the close resets the connection.
pub const REFUSE_DRAIN_BYTES_MAX: usize = 64 * 1024;
pub const REFUSE_DRAIN: Duration = Duration::from_millis(500);

/// The longest a live reader (long-poll, SSE step) waits in one piece before it looks at
/// its deadline and the stream again.
pub const LIVE_WAIT_SLICE: Duration = Duration::from_millis(500);
/// The most a feed's pump moves in one step; a bigger jump resets the window (sessions
/// behind it catch up on the owner, in bounded reads).
pub const FEED_STEP_BYTES_MAX: u64 = 1 << 20;
/// Recent data a feed keeps for SSE sessions slightly behind the tail.
pub const FEED_WINDOW_BYTES: usize = 256 << 10;
/// Values of at least this many bytes go out of an envelope-view read as zero-copy slices
/// of the stored bytes; shorter ones are copied into the framing around them, where an
/// iovec of their own would cost more than the copy.
pub const ENVELOPE_SLICE_BYTES_MIN: usize = 1024;

/// Submission-queue entries of each core's io_uring.
pub const URING_ENTRIES: u32 = 1024;
/// Pending connections each core's listener queues.
pub const LISTEN_BACKLOG: i32 = 1024;
/// How long a start waits for a port that is still in use. After a `kill -9` under load
/// the kernel keeps the dead process's listening socket for about 2 s while it tears down
/// its io_uring (the socket even accepts connections nobody answers), so a supervisor
/// restarting at once would otherwise lose that start. A port held by a live server is
/// still refused, only later.
pub const BIND_RETRY: Duration = Duration::from_secs(10);
/// How often each core's heartbeat timer is due (the loop-lag metric).
pub const HEARTBEAT: Duration = Duration::from_millis(10);
/// How often each core looks for expired streams nobody asks for.
pub const EXPIRY_SWEEP: Duration = Duration::from_secs(1);
/// How long shutdown lets in-flight requests (and other cores' hand-overs) finish.
pub const SHUTDOWN_DRAIN: Duration = Duration::from_secs(8);
/// How long a clean stop waits for the cold tier's last archive round. With the drain it
/// stays within the 30 s a service manager gives a stop (deploy/systemd: TimeoutStopSec)
/// and leaves it time for the final checkpoint.
pub const FINAL_ARCHIVE_ROUND: Duration = Duration::from_secs(15);

const _: () = assert!(SNAPSHOT_BODY_BYTES_MAX > BODY_BYTES_MAX);
const _: () = assert!(BODY_RESERVE_BYTES_MAX as u64 <= BODY_BYTES_MAX);
const _: () = assert!(BUCKET_ID_BYTES_MAX < BUCKETED_NAME_BYTES_MAX);
const _: () = assert!(FEED_WINDOW_BYTES as u64 <= FEED_STEP_BYTES_MAX);
const _: () = assert!(DECODED_BODY_FIRST_BYTES_MIN <= DECODED_BODY_DOUBLING_BYTES_MAX);
const _: () = assert!(DECODED_BODY_DOUBLING_BYTES_MAX as u64 <= BODY_BYTES_MAX);
