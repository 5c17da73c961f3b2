//! A forgetful disk: an in-memory FUSE file system that knows, for every file and
//! directory, what a power cut would keep.
//!
//! Every write and metadata change is served at once (the running server sees an ordinary
//! file system), and is also remembered as *pending* until it is made durable: a file's
//! writes, size changes and `fallocate`s by an `fsync`/`fdatasync` of that file or a write
//! through an `O_DSYNC` handle on it, a directory's entries (create, mkdir, rename, unlink)
//! by an `fsync` of that directory.
//! [`Disk::crash_image`] writes out what a power cut leaves: the durable state, plus any
//! subset of the pending writes, each torn into independent 512 B or 4 KiB sectors
//! applied in any order, with either the durable or the current metadata (a journal that
//! did or did not commit before the cut). That is what the page cache and a volatile disk
//! write cache allow.
//!
//! The crash point is the N-th mutating operation (`write`, `fsync`, `fsyncdir`, `create`,
//! `mkdir`, `unlink`, `rmdir`, `rename`, `setattr`, `fallocate`): it is not applied, and
//! the file system freezes there, holding that request, until the test has killed the
//! server; then every request fails with EIO, so nothing after the crash point reaches
//! the disk. Every file is opened with `FOPEN_DIRECT_IO`, so the kernel keeps no page
//! cache for it and each write reaches this file system before the syscall returns.

use std::collections::{BTreeMap, HashMap};
use std::ffi::{OsStr, OsString};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use fuser::{
    FileAttr, FileType, Filesystem, KernelConfig, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow,
};

use crate::support::Rng;

const PAGE: usize = 4096;
const ROOT: u64 = fuser::FUSE_ROOT_ID;
/// Attributes and entries are never cached by the kernel: every lookup sees this state.
const TTL: Duration = Duration::ZERO;

/// The test's handle on a mounted forgetful disk.
#[derive(Clone)]
pub struct Disk {
    state: Arc<Mutex<State>>,
    gate: Arc<Gate>,
}

/// How a crash image is cut from the disk's state.
#[derive(Clone, Copy, Debug)]
pub struct CutOptions {
    /// Chance that one sector of a pending write survives.
    pub survive: f64,
    /// Sector size the pending writes tear at (512 or 4096).
    pub sector: u64,
    /// Keep the current directory entries and file sizes (a metadata journal that
    /// committed just before the cut) instead of the durable ones.
    pub current_metadata: bool,
}

/// What a crash image dropped, for the test's report.
#[derive(Clone, Copy, Debug, Default)]
pub struct CutStats {
    pub files: usize,
    pub pending_writes: usize,
    pub sectors_kept: usize,
    pub sectors_lost: usize,
}

impl Disk {
    /// A disk that freezes at mutating operation number `crash_at` (0-based).
    pub fn new(crash_at: u64) -> Disk {
        let mut nodes = HashMap::new();
        nodes.insert(ROOT, Node::Dir(DirNode::default()));
        Disk {
            state: Arc::new(Mutex::new(State {
                nodes,
                next_ino: ROOT + 1,
            })),
            gate: Arc::new(Gate {
                phase: Mutex::new(Phase {
                    ops: 0,
                    crash_at,
                    state: Run::Running,
                }),
                changed: Condvar::new(),
            }),
        }
    }

    /// Mount the disk at `mountpoint`; it is unmounted when the session is dropped.
    pub fn mount(&self, mountpoint: &Path) -> std::io::Result<fuser::BackgroundSession> {
        let fs = Fs {
            state: self.state.clone(),
            gate: self.gate.clone(),
        };
        fuser::spawn_mount2(
            fs,
            mountpoint,
            &[fuser::MountOption::FSName("ursula-powerloss".into())],
        )
    }

    /// Wait up to `timeout` for the crash point; true once the disk is frozen there.
    pub fn wait_frozen(&self, timeout: Duration) -> bool {
        let phase = self.gate.lock();
        let (phase, _) = self
            .gate
            .changed
            .wait_timeout_while(phase, timeout, |p| p.state == Run::Running)
            .expect("gate lock");
        phase.state != Run::Running
    }

    /// True once the disk has reached its crash point.
    pub fn frozen(&self) -> bool {
        self.gate.lock().state != Run::Running
    }

    /// Make the next mutating operation the crash point (the workload ended first).
    pub fn crash_now(&self) {
        let mut phase = self.gate.lock();
        if phase.state == Run::Running {
            phase.crash_at = phase.ops;
        }
    }

    /// After the server is killed: fail the held request and every later one with EIO.
    pub fn thaw(&self) {
        self.gate.lock().state = Run::Dead;
        self.gate.changed.notify_all();
    }

    /// Mutating operations admitted before the crash point.
    pub fn ops_applied(&self) -> u64 {
        let phase = self.gate.lock();
        phase.ops.min(phase.crash_at)
    }

    /// Write what a power cut at the crash point leaves into the empty directory `out`.
    pub fn crash_image(
        &self,
        rng: &mut Rng,
        cut: CutOptions,
        out: &Path,
    ) -> std::io::Result<CutStats> {
        let state = self.state.lock().expect("disk state lock");
        let mut stats = CutStats::default();
        state.write_dir(ROOT, out, rng, cut, &mut stats)?;
        Ok(stats)
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Run {
    Running,
    /// Holding the request at the crash point.
    Frozen,
    /// The server is gone: everything fails.
    Dead,
}

struct Phase {
    ops: u64,
    crash_at: u64,
    state: Run,
}

struct Gate {
    phase: Mutex<Phase>,
    changed: Condvar,
}

impl Gate {
    fn lock(&self) -> MutexGuard<'_, Phase> {
        self.phase.lock().expect("gate lock")
    }

    /// May a mutating operation be applied? At the crash point this blocks until
    /// [`Disk::thaw`], so the request is never answered while the server lives.
    fn admit(&self) -> bool {
        let mut phase = self.lock();
        if phase.state != Run::Running {
            return false;
        }
        if phase.ops == phase.crash_at {
            phase.state = Run::Frozen;
            self.changed.notify_all();
            let _dead = self
                .changed
                .wait_while(phase, |p| p.state == Run::Frozen)
                .expect("gate lock");
            return false;
        }
        phase.ops += 1;
        true
    }

    /// Reads and lookups are served until the server is gone.
    fn alive(&self) -> bool {
        self.lock().state != Run::Dead
    }
}

/// A file's content as 4 KiB pages; a missing page reads as zeros.
#[derive(Clone, Default)]
struct Pages(HashMap<u64, Box<[u8]>>);

impl Pages {
    fn write(&mut self, off: u64, data: &[u8]) {
        let mut done = 0;
        while done < data.len() {
            let pos = off + done as u64;
            let (page, in_page) = (pos / PAGE as u64, (pos % PAGE as u64) as usize);
            let n = (PAGE - in_page).min(data.len() - done);
            let p = self
                .0
                .entry(page)
                .or_insert_with(|| vec![0u8; PAGE].into_boxed_slice());
            p[in_page..in_page + n].copy_from_slice(&data[done..done + n]);
            done += n;
        }
    }

    fn read(&self, off: u64, len: usize, out: &mut Vec<u8>) {
        out.resize(len, 0);
        let mut done = 0;
        while done < len {
            let pos = off + done as u64;
            let (page, in_page) = (pos / PAGE as u64, (pos % PAGE as u64) as usize);
            let n = (PAGE - in_page).min(len - done);
            match self.0.get(&page) {
                Some(p) => out[done..done + n].copy_from_slice(&p[in_page..in_page + n]),
                None => out[done..done + n].fill(0),
            }
            done += n;
        }
    }

    /// Drop everything at or beyond `size`.
    fn truncate(&mut self, size: u64) {
        let keep = size.div_ceil(PAGE as u64);
        self.0.retain(|&p, _| p < keep);
        let tail = (size % PAGE as u64) as usize;
        if tail > 0 {
            if let Some(p) = self.0.get_mut(&(size / PAGE as u64)) {
                p[tail..].fill(0);
            }
        }
    }
}

/// A change to a file not yet made durable.
enum Change {
    Write { off: u64, data: Vec<u8> },
    Truncate(u64),
}

#[derive(Default)]
struct FileNode {
    pages: Pages,
    size: u64,
    durable: Pages,
    durable_size: u64,
    pending: Vec<Change>,
}

impl FileNode {
    fn sync(&mut self) {
        for change in self.pending.drain(..) {
            match change {
                Change::Write { off, data } => self.durable.write(off, &data),
                Change::Truncate(size) => self.durable.truncate(size),
            }
        }
        self.durable_size = self.size;
        self.durable.truncate(self.size);
    }

    fn set_size(&mut self, size: u64) {
        if size < self.size {
            self.pages.truncate(size);
        }
        self.size = size;
        self.pending.push(Change::Truncate(size));
    }

    /// The content a power cut leaves: durable pages, then the surviving sectors of the
    /// pending writes (shuffled between truncates, so overlapping ones land in any order).
    fn cut(&self, rng: &mut Rng, cut: CutOptions, stats: &mut CutStats) -> (Pages, u64) {
        let mut pages = self.durable.clone();
        let mut kept: Vec<(u64, &[u8])> = Vec::new();
        let apply = |pages: &mut Pages, kept: &mut Vec<(u64, &[u8])>, rng: &mut Rng| {
            for i in (1..kept.len()).rev() {
                kept.swap(i, rng.range(0, i as u64) as usize);
            }
            for (off, data) in kept.drain(..) {
                pages.write(off, data);
            }
        };
        for change in &self.pending {
            match change {
                Change::Write { off, data } => {
                    stats.pending_writes += 1;
                    let mut pos = 0usize;
                    while pos < data.len() {
                        let at = off + pos as u64;
                        let n = ((cut.sector - at % cut.sector) as usize).min(data.len() - pos);
                        if rng.chance(cut.survive) {
                            kept.push((at, &data[pos..pos + n]));
                            stats.sectors_kept += 1;
                        } else {
                            stats.sectors_lost += 1;
                        }
                        pos += n;
                    }
                }
                Change::Truncate(size) if cut.current_metadata => {
                    apply(&mut pages, &mut kept, rng);
                    pages.truncate(*size);
                }
                Change::Truncate(_) => {}
            }
        }
        apply(&mut pages, &mut kept, rng);
        let size = if cut.current_metadata {
            self.size
        } else {
            self.durable_size
        };
        pages.truncate(size);
        (pages, size)
    }
}

#[derive(Default)]
struct DirNode {
    entries: BTreeMap<OsString, u64>,
    durable: BTreeMap<OsString, u64>,
}

enum Node {
    File(FileNode),
    Dir(DirNode),
}

struct State {
    nodes: HashMap<u64, Node>,
    next_ino: u64,
}

impl State {
    fn attr(&self, ino: u64) -> Option<FileAttr> {
        let (kind, size, perm, nlink) = match self.nodes.get(&ino)? {
            Node::File(f) => (FileType::RegularFile, f.size, 0o644, 1),
            Node::Dir(_) => (FileType::Directory, 0, 0o755, 2),
        };
        let t = SystemTime::UNIX_EPOCH;
        Some(FileAttr {
            ino,
            size,
            blocks: size.div_ceil(512),
            atime: t,
            mtime: t,
            ctime: t,
            crtime: t,
            kind,
            perm,
            nlink,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: PAGE as u32,
            flags: 0,
        })
    }

    fn dir(&mut self, ino: u64) -> Result<&mut DirNode, i32> {
        match self.nodes.get_mut(&ino) {
            Some(Node::Dir(d)) => Ok(d),
            Some(Node::File(_)) => Err(libc::ENOTDIR),
            None => Err(libc::ENOENT),
        }
    }

    fn file(&mut self, ino: u64) -> Result<&mut FileNode, i32> {
        match self.nodes.get_mut(&ino) {
            Some(Node::File(f)) => Ok(f),
            Some(Node::Dir(_)) => Err(libc::EISDIR),
            None => Err(libc::ENOENT),
        }
    }

    fn add(&mut self, parent: u64, name: &OsStr, node: Node) -> Result<u64, i32> {
        if self.dir(parent)?.entries.contains_key(name) {
            return Err(libc::EEXIST);
        }
        let ino = self.next_ino;
        self.next_ino += 1;
        self.nodes.insert(ino, node);
        self.dir(parent)?.entries.insert(name.to_owned(), ino);
        Ok(ino)
    }

    fn write_dir(
        &self,
        ino: u64,
        out: &Path,
        rng: &mut Rng,
        cut: CutOptions,
        stats: &mut CutStats,
    ) -> std::io::Result<()> {
        let Some(Node::Dir(d)) = self.nodes.get(&ino) else {
            return Ok(());
        };
        let entries = if cut.current_metadata {
            &d.entries
        } else {
            &d.durable
        };
        for (name, child) in entries {
            let path = out.join(name);
            match self.nodes.get(child) {
                Some(Node::Dir(_)) => {
                    std::fs::create_dir(&path)?;
                    self.write_dir(*child, &path, rng, cut, stats)?;
                }
                Some(Node::File(f)) => {
                    stats.files += 1;
                    let (pages, size) = f.cut(rng, cut, stats);
                    let file = std::fs::File::create(&path)?;
                    for (page, data) in &pages.0 {
                        if data.iter().any(|&b| b != 0) {
                            file.write_all_at(data, page * PAGE as u64)?;
                        }
                    }
                    file.set_len(size)?;
                }
                None => {}
            }
        }
        Ok(())
    }
}

struct Fs {
    state: Arc<Mutex<State>>,
    gate: Arc<Gate>,
}

impl Fs {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().expect("disk state lock")
    }
}

impl Filesystem for Fs {
    fn init(&mut self, _req: &Request<'_>, config: &mut KernelConfig) -> Result<(), i32> {
        // Large writes pass as one request (the log writes group commits of up to 1 MiB).
        let _ = config.set_max_write(1 << 20);
        Ok(())
    }

    fn lookup(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEntry) {
        if !self.gate.alive() {
            return reply.error(libc::EIO);
        }
        let mut st = self.state();
        let ino = match st.dir(parent) {
            Ok(d) => d.entries.get(name).copied(),
            Err(e) => return reply.error(e),
        };
        match ino.and_then(|i| st.attr(i)) {
            Some(a) => reply.entry(&TTL, &a, 0),
            None => reply.error(libc::ENOENT),
        }
    }

    fn getattr(&mut self, _req: &Request<'_>, ino: u64, _fh: Option<u64>, reply: ReplyAttr) {
        if !self.gate.alive() {
            return reply.error(libc::EIO);
        }
        match self.state().attr(ino) {
            Some(a) => reply.attr(&TTL, &a),
            None => reply.error(libc::ENOENT),
        }
    }

    fn setattr(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<u64>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<u32>,
        reply: ReplyAttr,
    ) {
        if let Some(size) = size {
            if !self.gate.admit() {
                return reply.error(libc::EIO);
            }
            let mut st = self.state();
            match st.file(ino) {
                Ok(f) => f.set_size(size),
                Err(e) => return reply.error(e),
            }
        } else if !self.gate.alive() {
            return reply.error(libc::EIO);
        }
        match self.state().attr(ino) {
            Some(a) => reply.attr(&TTL, &a),
            None => reply.error(libc::ENOENT),
        }
    }

    fn mkdir(
        &mut self,
        _req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        _mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        if !self.gate.admit() {
            return reply.error(libc::EIO);
        }
        let mut st = self.state();
        match st.add(parent, name, Node::Dir(DirNode::default())) {
            Ok(ino) => reply.entry(&TTL, &st.attr(ino).expect("new dir"), 0),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEmpty) {
        if !self.gate.admit() {
            return reply.error(libc::EIO);
        }
        let mut st = self.state();
        match st.dir(parent).map(|d| d.entries.remove(name)) {
            Ok(Some(_)) => reply.ok(),
            Ok(None) => reply.error(libc::ENOENT),
            Err(e) => reply.error(e),
        }
    }

    fn rmdir(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEmpty) {
        if !self.gate.admit() {
            return reply.error(libc::EIO);
        }
        let mut st = self.state();
        let child = match st.dir(parent).map(|d| d.entries.get(name).copied()) {
            Ok(Some(c)) => c,
            Ok(None) => return reply.error(libc::ENOENT),
            Err(e) => return reply.error(e),
        };
        match st.dir(child) {
            Ok(d) if !d.entries.is_empty() => return reply.error(libc::ENOTEMPTY),
            Ok(_) => {}
            Err(e) => return reply.error(e),
        }
        if let Ok(d) = st.dir(parent) {
            d.entries.remove(name);
        }
        reply.ok()
    }

    fn rename(
        &mut self,
        _req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        flags: u32,
        reply: ReplyEmpty,
    ) {
        if !self.gate.admit() {
            return reply.error(libc::EIO);
        }
        if flags & !libc::RENAME_NOREPLACE != 0 {
            return reply.error(libc::EINVAL);
        }
        let mut st = self.state();
        let ino = match st.dir(parent).map(|d| d.entries.get(name).copied()) {
            Ok(Some(i)) => i,
            Ok(None) => return reply.error(libc::ENOENT),
            Err(e) => return reply.error(e),
        };
        match st.dir(newparent) {
            Ok(d) if flags & libc::RENAME_NOREPLACE != 0 && d.entries.contains_key(newname) => {
                return reply.error(libc::EEXIST)
            }
            Ok(_) => {}
            Err(e) => return reply.error(e),
        }
        if let Ok(d) = st.dir(parent) {
            d.entries.remove(name);
        }
        if let Ok(d) = st.dir(newparent) {
            d.entries.insert(newname.to_owned(), ino);
        }
        reply.ok()
    }

    fn open(&mut self, _req: &Request<'_>, ino: u64, _flags: i32, reply: ReplyOpen) {
        if !self.gate.alive() {
            return reply.error(libc::EIO);
        }
        match self.state().nodes.get(&ino) {
            Some(_) => reply.opened(0, fuser::consts::FOPEN_DIRECT_IO),
            None => reply.error(libc::ENOENT),
        }
    }

    fn read(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        offset: i64,
        size: u32,
        _flags: i32,
        _lock_owner: Option<u64>,
        reply: ReplyData,
    ) {
        if !self.gate.alive() {
            return reply.error(libc::EIO);
        }
        let mut st = self.state();
        let f = match st.file(ino) {
            Ok(f) => f,
            Err(e) => return reply.error(e),
        };
        let off = offset.max(0) as u64;
        let len = (size as u64).min(f.size.saturating_sub(off)) as usize;
        let mut buf = Vec::new();
        f.pages.read(off, len, &mut buf);
        reply.data(&buf)
    }

    fn write(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        offset: i64,
        data: &[u8],
        _write_flags: u32,
        flags: i32,
        _lock_owner: Option<u64>,
        reply: ReplyWrite,
    ) {
        if !self.gate.admit() {
            return reply.error(libc::EIO);
        }
        let mut st = self.state();
        let f = match st.file(ino) {
            Ok(f) => f,
            Err(e) => return reply.error(e),
        };
        let off = offset.max(0) as u64;
        f.pages.write(off, data);
        f.size = f.size.max(off + data.len() as u64);
        f.pending.push(Change::Write {
            off,
            data: data.to_vec(),
        });
        // Through an O_DSYNC (or O_SYNC) handle a write is durable when it returns: a real
        // file system writes it and then flushes the disk's cache, which also keeps every
        // write that completed before it, as fdatasync does. (The kernel passes the handle's
        // open flags with each write and sends no fsync of its own for direct I/O.)
        if flags & libc::O_DSYNC != 0 {
            f.sync();
        }
        reply.written(data.len() as u32)
    }

    fn flush(&mut self, _req: &Request<'_>, _ino: u64, _fh: u64, _lock: u64, reply: ReplyEmpty) {
        reply.ok()
    }

    fn fsync(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        if !self.gate.admit() {
            return reply.error(libc::EIO);
        }
        // fdatasync also makes the size durable: it is needed to read the data back.
        match self.state().file(ino) {
            Ok(f) => {
                f.sync();
                reply.ok()
            }
            Err(e) => reply.error(e),
        }
    }

    fn readdir(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        offset: i64,
        mut reply: ReplyDirectory,
    ) {
        if !self.gate.alive() {
            return reply.error(libc::EIO);
        }
        let st = self.state();
        let Some(Node::Dir(d)) = st.nodes.get(&ino) else {
            return reply.error(libc::ENOTDIR);
        };
        let mut all = vec![
            (ino, FileType::Directory, OsString::from(".")),
            (ino, FileType::Directory, OsString::from("..")),
        ];
        for (name, child) in &d.entries {
            let kind = match st.nodes.get(child) {
                Some(Node::Dir(_)) => FileType::Directory,
                _ => FileType::RegularFile,
            };
            all.push((*child, kind, name.clone()));
        }
        for (i, (child, kind, name)) in all.into_iter().enumerate().skip(offset.max(0) as usize) {
            if reply.add(child, (i + 1) as i64, kind, name) {
                break;
            }
        }
        reply.ok()
    }

    fn fsyncdir(&mut self, _req: &Request<'_>, ino: u64, _fh: u64, _ds: bool, reply: ReplyEmpty) {
        if !self.gate.admit() {
            return reply.error(libc::EIO);
        }
        match self.state().dir(ino) {
            Ok(d) => {
                d.durable = d.entries.clone();
                reply.ok()
            }
            Err(e) => reply.error(e),
        }
    }

    fn statfs(&mut self, _req: &Request<'_>, _ino: u64, reply: ReplyStatfs) {
        let blocks = 1 << 28; // 1 TiB of 4 KiB blocks
        reply.statfs(
            blocks,
            blocks,
            blocks,
            1 << 20,
            1 << 20,
            PAGE as u32,
            255,
            PAGE as u32,
        )
    }

    fn create(
        &mut self,
        _req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        _mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        if !self.gate.admit() {
            return reply.error(libc::EIO);
        }
        let mut st = self.state();
        let existing = match st.dir(parent) {
            Ok(d) => d.entries.get(name).copied(),
            Err(e) => return reply.error(e),
        };
        let ino = match existing {
            Some(_) if flags & libc::O_EXCL != 0 => return reply.error(libc::EEXIST),
            Some(ino) => {
                if flags & libc::O_TRUNC != 0 {
                    if let Ok(f) = st.file(ino) {
                        f.set_size(0);
                    }
                }
                ino
            }
            None => match st.add(parent, name, Node::File(FileNode::default())) {
                Ok(ino) => ino,
                Err(e) => return reply.error(e),
            },
        };
        let attr = st.attr(ino).expect("created file");
        reply.created(&TTL, &attr, 0, 0, fuser::consts::FOPEN_DIRECT_IO)
    }

    fn fallocate(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        offset: i64,
        length: i64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        if mode & !libc::FALLOC_FL_KEEP_SIZE != 0 {
            return reply.error(libc::EOPNOTSUPP);
        }
        if !self.gate.admit() {
            return reply.error(libc::EIO);
        }
        let mut st = self.state();
        match st.file(ino) {
            Ok(f) => {
                let end = (offset + length).max(0) as u64;
                if mode & libc::FALLOC_FL_KEEP_SIZE == 0 && end > f.size {
                    // A size change: durable with the file's next fsync/fdatasync. The
                    // blocks read as zeros either way.
                    f.set_size(end);
                }
                reply.ok()
            }
            Err(e) => reply.error(e),
        }
    }
}
