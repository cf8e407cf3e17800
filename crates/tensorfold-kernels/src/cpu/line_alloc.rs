//! A process allocator that puts every block of 16 KiB or more on a 64-byte cache line (on unix; the system's
//! allocator otherwise).
//!
//! The CPU backend's activations are plain `Vec<f32>`; glibc hands large blocks out 16 bytes past a page, so a
//! 64-byte AVX-512 load of an activation row crosses two cache lines three times in four. The dot grid reads each
//! x row once per 4 weight rows, and split loads cost it about 8% (`grid_rate` over 2 KiB rows: 111 against 123
//! GFLOP/s; prefill of the 8B plan about 5%, docs/receipts/2026-12-07-cpu-vl-aligned.md). Alignment changes where a
//! value lives, never its bits. Binaries opt in with `#[global_allocator]`; the library itself never depends on it.
//!
//! A large block is C's `malloc` / `calloc` block of 128 bytes more, its first line boundary past a word handed
//! out, and the C pointer kept in the word before it. So the C allocator's own policies stay: its dynamic mmap
//! threshold (freed large blocks come back from the heap, not as fresh pages), `calloc`'s lazy zero pages for fresh
//! mappings (a synthetic checkpoint's tens of GiB are first touched by the threads that fill them, not by a
//! memset), `realloc`'s `mremap`. Asking `posix_memalign` instead costs every zeroed block a memset (std's
//! `alloc_zeroed` above 16-byte alignment): session 26 measured a synthetic 8B load at 33 s against 21 s that way.

use std::alloc::{GlobalAlloc, Layout, System};

/// Blocks of at least this many bytes are aligned to [`LINE`]: a prefill's activations (8 rows of 512 f32 and
/// more); smaller blocks, such as a decode step's one-row buffers, keep the system allocator as asked.
pub const LINE_ALIGNED_FROM: usize = 16 << 10;
/// A cache line, in bytes.
pub const LINE: usize = 64;
/// Extra bytes a large block asks of C: room to move up to a line boundary past the stored pointer.
const PAD: usize = 2 * LINE;

/// [`System`], with blocks of [`LINE_ALIGNED_FROM`] bytes or more (and an alignment of at most [`LINE`]) starting
/// on a line (see the module).
#[derive(Clone, Copy, Debug, Default)]
pub struct LineAligned;

/// Whether a block of `l` is a lined one: by its size and alignment alone, so it is freed as it was made.
fn lined(l: Layout) -> bool {
    cfg!(unix) && l.size() >= LINE_ALIGNED_FROM && l.align() <= LINE
}

/// The first line boundary at least a word past `raw` (at most `raw + 8 + 63`, inside a block of `size + PAD`).
fn line_after(raw: usize) -> usize {
    (raw + size_of::<usize>()).next_multiple_of(LINE)
}

/// Hands out the line in a C block `raw` (null stays null), recording `raw` in the word before it.
///
/// # Safety
/// `raw` is null or a C block of at least `PAD` bytes more than the caller will use.
unsafe fn hand_out(raw: *mut u8) -> *mut u8 {
    if raw.is_null() {
        return raw;
    }
    let a = raw.wrapping_add(line_after(raw as usize) - raw as usize);
    // SAFETY: `a - 8 .. a` lies inside the block (a is at least a word past raw) and is word-aligned (a is).
    unsafe { a.cast::<*mut u8>().sub(1).write(raw) };
    a
}

/// The C block of a lined pointer.
///
/// # Safety
/// `a` came from [`hand_out`] and its block is live.
unsafe fn c_block(a: *mut u8) -> *mut u8 {
    // SAFETY: the caller's promise: hand_out wrote the block's pointer there.
    unsafe { a.cast::<*mut u8>().sub(1).read() }
}

#[cfg(unix)]
mod c {
    pub use libc::{calloc, free, malloc, realloc};
}
#[cfg(not(unix))]
mod c {
    // `lined` is false off unix: these are never called.
    pub unsafe fn malloc(_: usize) -> *mut core::ffi::c_void {
        core::ptr::null_mut()
    }
    pub unsafe fn calloc(_: usize, _: usize) -> *mut core::ffi::c_void {
        core::ptr::null_mut()
    }
    pub unsafe fn realloc(_: *mut core::ffi::c_void, _: usize) -> *mut core::ffi::c_void {
        core::ptr::null_mut()
    }
    pub unsafe fn free(_: *mut core::ffi::c_void) {}
}

// SAFETY: a block's kind (System, or a lined C block) depends on its layout alone, and `dealloc` / `realloc`
// receive the layout it was made with, so each block is freed and resized by what made it; a lined pointer is a
// line boundary inside a C block `PAD` bytes longer than the layout, which covers the pointer word and the move to
// the boundary, and C's blocks are aligned for a word.
unsafe impl GlobalAlloc for LineAligned {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !lined(layout) {
            // SAFETY: forwarded.
            return unsafe { System.alloc(layout) };
        }
        let Some(size) = layout.size().checked_add(PAD) else { return std::ptr::null_mut() };
        // SAFETY: a fresh C block of size + PAD bytes.
        unsafe { hand_out(c::malloc(size).cast()) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if !lined(layout) {
            // SAFETY: forwarded.
            return unsafe { System.alloc_zeroed(layout) };
        }
        let Some(size) = layout.size().checked_add(PAD) else { return std::ptr::null_mut() };
        // SAFETY: as `alloc` (calloc zeroes the whole block, so the handed-out bytes too).
        unsafe { hand_out(c::calloc(size, 1).cast()) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if !lined(layout) {
            // SAFETY: forwarded: `ptr` came from System with `layout`.
            return unsafe { System.dealloc(ptr, layout) };
        }
        // SAFETY: `ptr` came from hand_out; its C block is freed once.
        unsafe { c::free(c_block(ptr).cast()) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let Ok(new) = Layout::from_size_align(new_size, layout.align()) else {
            return std::ptr::null_mut();
        };
        match (lined(layout), lined(new)) {
            // SAFETY: `ptr` came from System with `layout`; the alignment is kept.
            (false, false) => unsafe { System.realloc(ptr, layout, new_size) },
            // SAFETY: `ptr` came from hand_out (a live C block); see `relined`.
            (true, true) => unsafe { relined(ptr, layout.size(), new_size) },
            // Across the threshold: a new block, the bytes both hold, the old one freed (kept if the new one fails).
            // SAFETY: `new` has non-zero size (realloc's contract); `ptr` holds `layout.size()` readable bytes and
            // is freed by what made it.
            _ => unsafe {
                let p = self.alloc(new);
                if !p.is_null() {
                    std::ptr::copy_nonoverlapping(ptr, p, layout.size().min(new_size));
                    self.dealloc(ptr, layout);
                }
                p
            },
        }
    }
}

/// A lined block of `old` bytes resized to `new` bytes by C's realloc, its bytes moved to the new block's line
/// boundary when C moved the block to another offset from a line; null (the old block intact) when C fails.
///
/// # Safety
/// `a` came from [`hand_out`] with a live C block of `old + PAD` bytes.
unsafe fn relined(a: *mut u8, old: usize, new: usize) -> *mut u8 {
    let Some(size) = new.checked_add(PAD) else { return std::ptr::null_mut() };
    // SAFETY: the caller's promise.
    let raw = unsafe { c_block(a) };
    let off = a as usize - raw as usize;
    // SAFETY: `raw` is a live C block; on failure C leaves it untouched.
    let moved: *mut u8 = unsafe { c::realloc(raw.cast(), size) }.cast();
    if moved.is_null() {
        return moved;
    }
    let new_off = line_after(moved as usize) - moved as usize;
    if new_off != off {
        // SAFETY: both ranges lie inside the new block of new + PAD bytes (offsets below PAD); C kept the first
        // min(old, new) + PAD bytes, which hold the data at `off`.
        unsafe { std::ptr::copy(moved.add(off), moved.add(new_off), old.min(new)) };
    }
    // SAFETY: `moved` is a C block of new + PAD bytes.
    unsafe { hand_out(moved) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Blocks from 16 KiB up start on a line, zeroed when asked (in C's heap and past its mmap threshold); smaller
    /// ones keep their own alignment.
    #[test]
    fn large_blocks_start_on_a_line() {
        let a = LineAligned;
        for size in [16_384usize, 16_388, 65_536, 1 << 20, 40 << 20] {
            for _ in 0..8 {
                let l = Layout::from_size_align(size, 4).unwrap();
                // SAFETY: non-zero size; freed with the same layout.
                unsafe {
                    let p = a.alloc_zeroed(l);
                    assert!(!p.is_null(), "{size} bytes: no block");
                    assert_eq!(p as usize % LINE, 0, "{size} bytes not on a line");
                    assert!([0, size / 2, size - 1].iter().all(|&i| *p.add(i) == 0), "{size} bytes not zeroed");
                    *p.add(size - 1) = 7; // a block reused next round must come back zeroed all the same
                    a.dealloc(p, l);
                    let q = a.alloc(l);
                    assert!(!q.is_null() && (q as usize).is_multiple_of(LINE));
                    *q = 1;
                    *q.add(size - 1) = 9;
                    a.dealloc(q, l);
                }
            }
        }
        // SAFETY: as above.
        unsafe {
            let l = Layout::from_size_align(100, 4).unwrap();
            let p = a.alloc(l);
            assert!(!p.is_null() && (p as usize).is_multiple_of(4));
            a.dealloc(p, l);
            let big = Layout::from_size_align(1 << 16, 256).unwrap(); // wider than a line: System's own
            let p = a.alloc(big);
            assert!(!p.is_null() && (p as usize).is_multiple_of(256));
            a.dealloc(p, big);
        }
    }

    /// Growing and shrinking across the threshold and inside the large class, where C moves blocks between its
    /// heap and mappings, keeps the bytes the block held and its line.
    #[test]
    fn reallocs_keep_the_bytes_and_the_line() {
        let a = LineAligned;
        // SAFETY: every block is used inside its current size and freed with its current layout.
        unsafe {
            let mut size = 64;
            let mut p = a.alloc(Layout::from_size_align(size, 4).unwrap());
            assert!(!p.is_null());
            // Every byte (a move of the wrong length loses the tail).
            let fill = |p: *mut u8, n: usize| (0..n).for_each(|i| *p.add(i) = (i % 251) as u8);
            let check = |p: *mut u8, n: usize| (0..n).all(|i| *p.add(i) == (i % 251) as u8);
            fill(p, size);
            let sizes = [512, 20_000, 1 << 20, 40 << 20, 96 << 20, 100_000, 17_000, 1000, 30_000, 8, 50 << 20];
            for next in sizes {
                p = a.realloc(p, Layout::from_size_align(size, 4).unwrap(), next);
                assert!(!p.is_null(), "realloc {size} -> {next} failed");
                assert!(check(p, size.min(next)), "bytes lost going {size} -> {next}");
                if next >= LINE_ALIGNED_FROM {
                    assert_eq!(p as usize % LINE, 0, "{next} bytes after realloc not on a line");
                }
                fill(p, next);
                size = next;
            }
            a.dealloc(p, Layout::from_size_align(size, 4).unwrap());
        }
    }
}
