//! 4 KiB-aligned heap buffers for `O_DIRECT` I/O, and a small per-shard pool of them.
//!
//! `O_DIRECT` requires the buffer address, the file offset and the length to be multiples of
//! the device's logical block size; we use 4 KiB everywhere (the physical block size of the
//! disks we run on). Buffers are recycled through [`BufPool`] so the append path does not
//! allocate per request.

use crate::limits::{IO_BLOCK_BYTES, MAPPED_BUF_BYTES_MIN};
use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::cell::RefCell;
use std::ptr::NonNull;
use std::rc::Rc;

/// Round `n` up to the next multiple of [`IO_BLOCK_BYTES`].
pub const fn align_up(n: usize) -> usize {
    (n + IO_BLOCK_BYTES - 1) & !(IO_BLOCK_BYTES - 1)
}

/// Round `n` down to a multiple of [`IO_BLOCK_BYTES`].
pub const fn align_down(n: usize) -> usize {
    n & !(IO_BLOCK_BYTES - 1)
}

/// A zero-initialised, [`IO_BLOCK_BYTES`]-aligned byte buffer with a fixed capacity and a length.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    cap: usize,
    len: usize,
    /// From `mmap` (at least [`MAPPED_BUF_BYTES_MIN`]), not from the allocator.
    mapped: bool,
}

// SAFETY: AlignedBuf owns its allocation exclusively (like Vec<u8>); moving it to another
// thread moves that ownership. It has no interior mutability.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared references only allow reads of initialised memory.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A buffer able to hold at least `capacity` bytes (rounded up to whole blocks), all zero.
    pub fn with_capacity(capacity: usize) -> AlignedBuf {
        let cap = align_up(capacity.max(IO_BLOCK_BYTES));
        let layout = Layout::from_size_align(cap, IO_BLOCK_BYTES).expect("aligned layout");
        if cap >= MAPPED_BUF_BYTES_MIN {
            // SAFETY: an anonymous private mapping of `cap` bytes at an address the kernel
            // picks: no file, no existing memory involved. The kernel zero-fills it and
            // aligns it to a page (4 KiB, a multiple of IO_BLOCK_BYTES's alignment).
            let raw = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    cap,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            if raw != libc::MAP_FAILED {
                if let Some(ptr) = NonNull::new(raw.cast::<u8>()) {
                    return AlignedBuf {
                        ptr,
                        cap,
                        len: 0,
                        mapped: true,
                    };
                }
            }
            std::alloc::handle_alloc_error(layout);
        }
        // SAFETY: layout has non-zero size (cap >= IO_BLOCK_BYTES).
        let raw = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        AlignedBuf {
            ptr,
            cap,
            len: 0,
            mapped: false,
        }
    }

    pub fn capacity(&self) -> usize {
        self.cap
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Set the logical length. Bytes past the old length are whatever the buffer held, which is
    /// always initialised memory (zeroed at allocation, or earlier content).
    pub fn set_len(&mut self, len: usize) {
        assert!(
            len <= self.cap,
            "set_len {len} beyond capacity {}",
            self.cap
        );
        self.len = len;
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is valid for cap bytes, all initialised; len <= cap.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The whole capacity, for filling.
    pub fn as_mut_full(&mut self) -> &mut [u8] {
        // SAFETY: ptr is valid and initialised for cap bytes and uniquely borrowed.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.cap) }
    }

    /// Append bytes; panics if they do not fit (callers size buffers first).
    pub fn extend_from_slice(&mut self, bytes: &[u8]) {
        let end = self.len + bytes.len();
        assert!(
            end <= self.cap,
            "append of {} overflows buffer",
            bytes.len()
        );
        let start = self.len;
        self.as_mut_full()[start..end].copy_from_slice(bytes);
        self.len = end;
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if self.mapped {
            // SAFETY: mapped in with_capacity with exactly this address and length, and
            // owned by this buffer alone; nothing borrows it once it is dropped. munmap of
            // a valid mapping cannot fail.
            unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.cap) };
            return;
        }
        let layout = Layout::from_size_align(self.cap, IO_BLOCK_BYTES).expect("aligned layout");
        // SAFETY: allocated in with_capacity with exactly this layout.
        unsafe { dealloc(self.ptr.as_ptr(), layout) }
    }
}

impl AsRef<[u8]> for AlignedBuf {
    fn as_ref(&self) -> &[u8] {
        self.as_slice()
    }
}

// SAFETY: read_ptr stays valid and fixed while the buffer is owned by the runtime (the heap
// allocation never moves); bytes_init is the initialised length.
unsafe impl monoio::buf::IoBuf for AlignedBuf {
    fn read_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }
    fn bytes_init(&self) -> usize {
        self.len
    }
}

// SAFETY: write_ptr is valid for bytes_total bytes; set_init only records a length <= cap.
unsafe impl monoio::buf::IoBufMut for AlignedBuf {
    fn write_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    fn bytes_total(&mut self) -> usize {
        self.cap
    }
    unsafe fn set_init(&mut self, pos: usize) {
        self.len = pos.min(self.cap);
    }
}

/// Recycles write buffers, so the append path neither allocates nor zeroes per batch.
///
/// Buffers larger than the standard size (a batch that outgrew it, a 32 MiB append) are
/// kept too, up to a byte bound: fresh multi-MiB allocations cost a zeroing pass and page
/// faults per group commit, which was a fifth of a large-batch ingest's server CPU.
/// A recycled buffer holds whatever it held before; writers zero their own padding.
#[derive(Clone)]
pub struct BufPool {
    inner: Rc<RefCell<PoolInner>>,
}

struct PoolInner {
    standard: usize,
    free: Vec<AlignedBuf>,
    max_free: usize,
    /// Most bytes of capacity the free list may hold.
    max_free_bytes: usize,
}

impl BufPool {
    pub fn new(standard_size: usize, max_free: usize, max_free_bytes: usize) -> BufPool {
        BufPool {
            inner: Rc::new(RefCell::new(PoolInner {
                standard: align_up(standard_size),
                free: Vec::new(),
                max_free,
                max_free_bytes,
            })),
        }
    }

    /// An empty buffer of at least `min_capacity` bytes (and at least the standard size).
    /// The largest free buffer that fits is preferred, so a batch seldom has to grow.
    pub fn take(&self, min_capacity: usize) -> AlignedBuf {
        let mut inner = self.inner.borrow_mut();
        let largest = (0..inner.free.len()).max_by_key(|&i| inner.free[i].capacity());
        if let Some(i) = largest.filter(|&i| inner.free[i].capacity() >= min_capacity) {
            let mut buf = inner.free.swap_remove(i);
            buf.set_len(0);
            return buf;
        }
        AlignedBuf::with_capacity(min_capacity.max(inner.standard))
    }

    /// Bytes of the free buffers kept for reuse.
    pub fn free_bytes(&self) -> usize {
        self.inner
            .borrow()
            .free
            .iter()
            .map(AlignedBuf::capacity)
            .sum()
    }

    pub fn give(&self, mut buf: AlignedBuf) {
        let mut inner = self.inner.borrow_mut();
        let held: usize = inner.free.iter().map(AlignedBuf::capacity).sum();
        if inner.free.len() < inner.max_free && held + buf.capacity() <= inner.max_free_bytes {
            buf.set_len(0);
            inner.free.push(buf);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alignment_and_rounding() {
        let b = AlignedBuf::with_capacity(10);
        assert_eq!(b.capacity(), IO_BLOCK_BYTES);
        assert_eq!(b.as_slice().as_ptr() as usize % IO_BLOCK_BYTES, 0);
        assert_eq!(align_up(0), 0);
        assert_eq!(align_up(1), IO_BLOCK_BYTES);
        assert_eq!(align_up(IO_BLOCK_BYTES), IO_BLOCK_BYTES);
        assert_eq!(align_down(IO_BLOCK_BYTES + 5), IO_BLOCK_BYTES);
    }

    #[test]
    fn large_buffers_are_mapped_zeroed_aligned_and_writable() {
        let mut b = AlignedBuf::with_capacity(MAPPED_BUF_BYTES_MIN + 1);
        assert!(b.mapped);
        assert_eq!(b.capacity(), MAPPED_BUF_BYTES_MIN + IO_BLOCK_BYTES);
        assert_eq!(b.as_mut_full().as_ptr() as usize % IO_BLOCK_BYTES, 0);
        assert!(b.as_mut_full().iter().all(|&x| x == 0));
        b.extend_from_slice(b"abc");
        b.set_len(b.capacity());
        b.as_mut_full()[MAPPED_BUF_BYTES_MIN] = 7;
        assert_eq!(&b.as_slice()[..3], b"abc");
        assert!(!AlignedBuf::with_capacity(MAPPED_BUF_BYTES_MIN - IO_BLOCK_BYTES).mapped);
    }

    #[test]
    fn pool_reuses_buffers_within_its_bounds() {
        let pool = BufPool::new(8192, 2, 4 * 8192);
        let mut a = pool.take(100);
        assert_eq!(a.capacity(), 8192);
        a.extend_from_slice(b"hello");
        let ptr = a.as_slice().as_ptr();
        pool.give(a);
        let b = pool.take(10);
        assert_eq!(b.as_slice().as_ptr(), ptr);
        assert!(b.is_empty());

        // A larger buffer is kept and preferred; one over the byte bound is freed.
        let big = pool.take(3 * 8192);
        assert!(big.capacity() >= 3 * 8192);
        let big_ptr = big.as_slice().as_ptr();
        pool.give(big);
        pool.give(b);
        assert_eq!(pool.take(10).as_slice().as_ptr(), big_ptr);
        pool.give(pool.take(1 << 20));
        let free = &pool.inner.borrow().free;
        assert_eq!(free.len(), 1);
        assert_eq!(free[0].capacity(), 8192);
    }
}
