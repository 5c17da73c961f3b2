//! Segment files: fixed-size, preallocated, written only with `O_DIRECT`.
//!
//! ```text
//! <data-dir>/shard-<core>/<index:010>.seg
//! block 0      header: magic "URSLSEG1", format version, shard, segment index, first LSN, CRC
//! block 1..    records packed back to back (see record.rs); the rest stays zero
//! ```
//!
//! A segment is written at increasing positions only, and is *sealed* once the log rolls to
//! the next one: from then on it never changes, so it can be copied elsewhere (an object store)
//! and read by (segment index, position) exactly as from the local file.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use bytes::Bytes;

use crate::aligned::AlignedBuf;
use crate::limits::{IO_BLOCK_BYTES, SPARE_ZERO_BYTES_PER_SEC, SYNCED_WRITE_PIECE_BYTES};
use crate::position::{Lsn, SegmentNo};

pub const MAGIC: &[u8; 8] = b"URSLSEG1";
pub const FORMAT_VERSION: u32 = 1;
/// Records start after the header block.
pub const DATA_START: u64 = IO_BLOCK_BYTES as u64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentHeader {
    pub shard: u32,
    pub index: SegmentNo,
    pub first_lsn: Lsn,
}

impl SegmentHeader {
    pub fn encode(&self, block: &mut [u8]) {
        block[..IO_BLOCK_BYTES].fill(0);
        block[0..8].copy_from_slice(MAGIC);
        block[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        block[12..16].copy_from_slice(&self.shard.to_le_bytes());
        block[16..24].copy_from_slice(&self.index.get().to_le_bytes());
        block[24..32].copy_from_slice(&self.first_lsn.get().to_le_bytes());
        let crc = crc32c::crc32c(&block[0..32]);
        block[32..36].copy_from_slice(&crc.to_le_bytes());
    }

    pub fn decode(block: &[u8]) -> Option<SegmentHeader> {
        if block.len() < 36 || &block[0..8] != MAGIC {
            return None;
        }
        let crc = u32::from_le_bytes(block[32..36].try_into().ok()?);
        if crc32c::crc32c(&block[0..32]) != crc {
            return None;
        }
        if u32::from_le_bytes(block[8..12].try_into().ok()?) != FORMAT_VERSION {
            return None;
        }
        Some(SegmentHeader {
            shard: u32::from_le_bytes(block[12..16].try_into().ok()?),
            index: SegmentNo::new(u64::from_le_bytes(block[16..24].try_into().ok()?)),
            first_lsn: Lsn::new(u64::from_le_bytes(block[24..32].try_into().ok()?)),
        })
    }
}

pub fn segment_path(dir: &Path, index: SegmentNo) -> PathBuf {
    dir.join(format!("{:010}.seg", index.get()))
}

/// Segment indexes present in `dir`, ascending.
pub fn list_segments(dir: &Path) -> io::Result<Vec<SegmentNo>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let name = entry?.file_name();
        let Some(name) = name.to_str() else { continue };
        if let Some(stem) = name.strip_suffix(".seg") {
            if let Ok(i) = stem.parse::<u64>() {
                out.push(SegmentNo::new(i));
            }
        }
    }
    out.sort_unstable();
    Ok(out)
}

pub fn open_direct(path: &Path, create: bool) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(create)
        .custom_flags(libc::O_DIRECT)
        .open(path)
}

/// The log's write handle on segment `index`: `O_DIRECT` and `O_DSYNC`, so a write
/// completes only once its data, and any metadata needed to read it back, are on stable
/// storage, as if an fdatasync had followed it (the kernel flushes the disk's write cache
/// after the data reaches it). Only the test switch `URSULA_FAULT_SKIP_FDATASYNC` opens it
/// without `O_DSYNC`.
pub fn open_log_writer(dir: &Path, index: SegmentNo) -> io::Result<File> {
    let dsync = if crate::fault::skips().fdatasync {
        0
    } else {
        libc::O_DSYNC
    };
    OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT | dsync)
        .open(segment_path(dir, index))
}

/// Create a segment: reserve its full size, write the header block, and make both the file
/// and its directory entry durable before any record goes in.
pub fn create_segment(dir: &Path, header: SegmentHeader, size: u64) -> io::Result<File> {
    let path = segment_path(dir, header.index);
    let file = open_direct(&path, true)?;
    if let Err(err) = reserve(&file, size) {
        drop(file);
        let _ = std::fs::remove_file(&path);
        return Err(err);
    }
    write_header(&file, header)?;
    file.sync_all()?;
    sync_dir(dir)?;
    Ok(file)
}

/// Where a shard keeps the segment it prepares ahead of need (see `prepare_spare`). The
/// name does not end in `.seg`, so `list_segments` and recovery never see it.
pub fn spare_path(dir: &Path) -> PathBuf {
    dir.join("spare.seg.tmp")
}

/// Prepare a spare segment of `size` bytes with every block written (zeros) and durable.
/// An `fallocate`d extent starts unwritten, and ext4 converts it after each O_DIRECT
/// write that first lands on it, a metadata change every group commit then waits for;
/// records written into a spare overwrite initialised blocks instead (+8% appends/s at
/// 100 writers, docs/benchmarks.md). Blocking: runs on a helper thread.
pub fn prepare_spare(dir: &Path, size: u64) -> io::Result<()> {
    remove_spare(dir)?;
    let result = zero_fill(&spare_path(dir), size);
    if result.is_err() {
        // Give the space back (a full disk is the likely cause); the log carries on with
        // segments made by `create_segment`.
        let _ = remove_spare(dir);
    }
    result
}

/// Remove the spare segment, if there is one.
pub fn remove_spare(dir: &Path) -> io::Result<()> {
    match std::fs::remove_file(spare_path(dir)) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

fn zero_fill(path: &Path, size: u64) -> io::Result<()> {
    let file = open_direct(path, true)?;
    // Reserve the whole size first: contiguous blocks, and a full disk fails here.
    reserve(&file, size)?;
    let zeros = {
        let mut b = AlignedBuf::with_capacity(1 << 20);
        b.set_len(1 << 20);
        b
    };
    // Paced, so the zeroing never takes the disk from the log's own flushes for long: a
    // spare is only made after a segment that took 2 s or more to fill.
    let started = std::time::Instant::now();
    let mut pos = 0;
    while pos < size {
        let n = (size - pos).min(zeros.len() as u64) as usize;
        write_all_at_blocking(&file, &zeros.as_slice()[..n], pos)?;
        pos += n as u64;
        let due = std::time::Duration::from_secs_f64(pos as f64 / SPARE_ZERO_BYTES_PER_SEC);
        if let Some(ahead) = due.checked_sub(started.elapsed()) {
            std::thread::sleep(ahead);
        }
    }
    file.sync_all()
}

/// Make the prepared spare segment `header.index`: write its header, make that durable,
/// then rename it into place and make the rename durable. Until the rename, a crash leaves
/// only the spare (removed at the next open); after it, a segment exactly like one
/// `create_segment` makes.
pub fn adopt_spare(dir: &Path, header: SegmentHeader, size: u64) -> io::Result<File> {
    let spare = spare_path(dir);
    let file = open_direct(&spare, false)?;
    if file.metadata()?.len() != size {
        return Err(io::Error::other("spare segment has the wrong size"));
    }
    write_header(&file, header)?;
    file.sync_data()?;
    std::fs::rename(&spare, segment_path(dir, header.index))?;
    sync_dir(dir)?;
    Ok(file)
}

/// Write the header block of a segment.
fn write_header(file: &File, header: SegmentHeader) -> io::Result<()> {
    let mut block = AlignedBuf::with_capacity(IO_BLOCK_BYTES);
    block.set_len(IO_BLOCK_BYTES);
    header.encode(block.as_mut_full());
    write_all_at_blocking(file, block.as_slice(), 0)
}

/// Allocate `size` bytes for `file` (`fallocate`, mode 0).
fn reserve(file: &File, size: u64) -> io::Result<()> {
    // SAFETY: fd is a valid open file; fallocate only reads its scalar arguments.
    let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, size as libc::off_t) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

pub fn write_all_at_blocking(file: &File, buf: &[u8], pos: u64) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    file.write_all_at(buf, pos)
}

/// Create `dir` and any missing parents so that they survive a power cut: a new
/// directory's entry is durable only once the directory holding it is synced, and a file
/// synced inside a directory that vanished is lost with it.
pub fn create_dir_durable(dir: &Path) -> io::Result<()> {
    let mut missing = Vec::new();
    let mut at = dir;
    while !at.exists() {
        missing.push(at);
        match at.parent() {
            Some(parent) => at = parent,
            None => break,
        }
    }
    std::fs::create_dir_all(dir)?;
    for created in missing.into_iter().rev() {
        match created.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => sync_dir(parent)?,
            _ => sync_dir(Path::new("."))?,
        }
    }
    Ok(())
}

/// Write `bytes` as the whole of the file at `tmp` (created or truncated) and sync it, on
/// the core's io_uring: the first half of a replace-by-rename (index files, checkpoints).
pub(crate) async fn write_synced(tmp: &Path, bytes: Vec<u8>) -> io::Result<()> {
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(tmp)?;
    let file = monoio::fs::File::from_std(file)?;
    // A buffered write is copied into the page cache inside the submitting call, on the
    // core's thread: one write of a 40 MB checkpoint held the core for tens of
    // milliseconds. In pieces, the core's requests run between them.
    let bytes = Bytes::from(bytes);
    let mut at = 0;
    while at < bytes.len() {
        let piece = bytes.slice(at..(at + SYNCED_WRITE_PIECE_BYTES).min(bytes.len()));
        let len = piece.len();
        let (res, _) = file.write_all_at(piece, at as u64).await;
        res?;
        at += len;
    }
    file.sync_all().await
}

pub fn sync_dir(dir: &Path) -> io::Result<()> {
    if crate::fault::skips().dirsync {
        return Ok(());
    }
    File::open(dir)?.sync_all()
}

/// [`sync_dir`] through the core's io_uring. A directory fsync waits for the file system's
/// journal, milliseconds while the log is busy; on the core's thread every connection of
/// the core would wait with it.
pub(crate) async fn sync_dir_on_ring(dir: &Path) -> io::Result<()> {
    if crate::fault::skips().dirsync {
        return Ok(());
    }
    monoio::fs::File::open(dir).await?.sync_all().await
}

/// Rename `from` over `to` in `dir` and make the rename durable, through the core's
/// io_uring (a rename too can wait on the journal: up to 39 ms were measured for a
/// checkpoint's while the log was busy).
pub(crate) async fn rename_durable(from: &Path, to: &Path, dir: &Path) -> io::Result<()> {
    monoio::fs::rename(from, to).await?;
    sync_dir_on_ring(dir).await
}

/// Delete `path` in `dir` durably through the core's io_uring: unlinking a preallocated
/// segment frees all of its extents.
pub(crate) async fn remove_durable(path: &Path, dir: &Path) -> io::Result<()> {
    monoio::fs::remove_file(path).await?;
    sync_dir_on_ring(dir).await
}

/// Up to `len` bytes of the file at `path` from `offset`: fewer at its end, as a ranged GET
/// of an archived segment returns (used by stand-in cold tiers in tests and benches).
pub fn read_up_to(path: &Path, offset: u64, len: usize) -> io::Result<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let file = File::open(path)?;
    let mut buf = vec![0u8; len];
    let mut got = 0;
    while got < len {
        let n = file.read_at(&mut buf[got..], offset + got as u64)?;
        if n == 0 {
            break;
        }
        got += n;
    }
    buf.truncate(got);
    Ok(buf)
}

/// Read a whole segment with direct I/O.
pub fn read_whole(path: &Path) -> io::Result<AlignedBuf> {
    let file = open_direct(path, false)?;
    let len = file.metadata()?.len() as usize;
    read_prefix(&file, len)
}

/// Read a segment with direct I/O up to one block past its written part, and at least to
/// `at_least`: what lies beyond reads as zeros. A segment is preallocated, and the file
/// system reports what was never written as a hole, so a log that ends early in its
/// segment is read up to its end rather than all 128 MiB (recovery reads the tail segment
/// of every shard, and a lane's new owner recovers it from a restore). Where the file
/// system cannot tell, the whole file is read.
pub fn read_written(path: &Path, at_least: u64) -> io::Result<AlignedBuf> {
    let file = open_direct(path, false)?;
    let len = file.metadata()?.len();
    let written = written_end(&file).unwrap_or(len);
    let upto = (crate::aligned::align_up(written.max(at_least) as usize) as u64
        + IO_BLOCK_BYTES as u64)
        .min(len);
    read_prefix(&file, upto as usize)
}

/// The end of the last extent of `file` that holds data (`SEEK_DATA` / `SEEK_HOLE`).
fn written_end(file: &File) -> io::Result<u64> {
    let fd = file.as_raw_fd();
    let mut end = 0;
    loop {
        // SAFETY: lseek takes a file descriptor and two integers and touches no memory of
        // ours; `fd` belongs to `file`, open for the whole call.
        let data = unsafe { libc::lseek(fd, end as libc::off_t, libc::SEEK_DATA) };
        if data < 0 {
            let e = io::Error::last_os_error();
            // ENXIO: no data at or after `end`.
            return match e.raw_os_error() {
                Some(libc::ENXIO) => Ok(end),
                _ => Err(e),
            };
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(fd, data, libc::SEEK_HOLE) };
        if hole < 0 {
            return Err(io::Error::last_os_error());
        }
        end = hole as u64;
    }
}

/// The first `len` bytes of `file` (fewer if it is shorter), read with direct I/O.
fn read_prefix(file: &File, len: usize) -> io::Result<AlignedBuf> {
    use std::os::unix::fs::FileExt;
    let mut buf = AlignedBuf::with_capacity(len);
    let full = buf.as_mut_full();
    let mut done = 0;
    while done < len {
        let n = file.read_at(&mut full[done..crate::aligned::align_up(len)], done as u64)?;
        if n == 0 {
            break;
        }
        done += n;
    }
    buf.set_len(done.min(len));
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_roundtrip_and_rejects_corruption() {
        let h = SegmentHeader {
            shard: 3,
            index: SegmentNo::new(17),
            first_lsn: Lsn::new(1234),
        };
        let mut block = vec![0u8; IO_BLOCK_BYTES];
        h.encode(&mut block);
        assert_eq!(SegmentHeader::decode(&block), Some(h));
        block[20] ^= 1;
        assert_eq!(SegmentHeader::decode(&block), None);
    }

    #[test]
    fn create_list_and_read_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let h = SegmentHeader {
            shard: 0,
            index: SegmentNo::new(2),
            first_lsn: Lsn::FIRST,
        };
        create_segment(dir.path(), h, 1 << 20).expect("create");
        assert!(
            create_segment(dir.path(), h, 1 << 20).is_err(),
            "never overwrite"
        );
        assert_eq!(
            list_segments(dir.path()).expect("list"),
            vec![SegmentNo::new(2)]
        );
        let buf = read_whole(&segment_path(dir.path(), SegmentNo::new(2))).expect("read");
        assert_eq!(buf.len(), 1 << 20);
        assert_eq!(SegmentHeader::decode(buf.as_slice()), Some(h));
        assert!(buf.as_slice()[IO_BLOCK_BYTES..].iter().all(|&b| b == 0));
    }

    #[test]
    fn read_written_stops_after_what_was_written() {
        let dir = tempfile::tempdir().expect("tempdir");
        let h = SegmentHeader {
            shard: 0,
            index: SegmentNo::new(3),
            first_lsn: Lsn::FIRST,
        };
        let file = create_segment(dir.path(), h, 8 << 20).expect("create");
        let mut block = AlignedBuf::with_capacity(3 * IO_BLOCK_BYTES);
        block.set_len(3 * IO_BLOCK_BYTES);
        block.as_mut_full()[..3 * IO_BLOCK_BYTES].fill(7);
        write_all_at_blocking(&file, block.as_slice(), IO_BLOCK_BYTES as u64).expect("write");
        file.sync_all().expect("sync");
        let path = segment_path(dir.path(), SegmentNo::new(3));
        let whole = read_whole(&path).expect("read whole");
        let written = read_written(&path, 0).expect("read written");
        // Never shorter than the data and a zero block after it; a file system that
        // reports no holes gives the whole file.
        assert!(written.len() >= 5 * IO_BLOCK_BYTES, "{}", written.len());
        assert_eq!(written.as_slice(), &whole.as_slice()[..written.len()]);
        assert!(whole.as_slice()[written.len()..].iter().all(|&b| b == 0));
        // `at_least` reaches past the data.
        let far = read_written(&path, 6 << 20).expect("read far");
        assert!(far.len() > 6 << 20);
        assert_eq!(far.as_slice(), &whole.as_slice()[..far.len()]);
    }

    #[test]
    fn create_dir_durable_makes_every_missing_level_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let deep = dir.path().join("a").join("b");
        create_dir_durable(&deep).expect("create");
        assert!(deep.is_dir());
        create_dir_durable(&deep).expect("an existing directory is fine");
        std::fs::write(deep.join("f"), b"x").expect("write");
        assert!(
            create_dir_durable(&deep.join("f")).is_err(),
            "a file is not a directory"
        );
    }
}
