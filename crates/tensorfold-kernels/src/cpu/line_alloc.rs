//! A process allocator that puts every block of 16 KiB or more on a 64-byte cache line (the system's otherwise).
//!
//! The CPU backend's activations are plain `Vec<f32>`; glibc hands large blocks out 16 bytes past a page, so a
//! 64-byte AVX-512 load of an activation row crosses two cache lines three times in four. The dot grid reads each
//! x row once per 4 weight rows, and split loads cost it about 8% (`grid` over 2 KiB rows: 113 against 123 GFLOP/s;
//! prefill of the 8B plan about 5%, docs/receipts/2026-12-07-cpu-vl-aligned.md). Alignment changes where a value
//! lives, never its bits. Binaries opt in with `#[global_allocator]`; the library itself never depends on it.

use std::alloc::{GlobalAlloc, Layout, System};

/// Blocks of at least this many bytes are aligned to [`LINE`]: a prefill's activations (8 rows of 512 f32 and
/// more); smaller blocks, such as a decode step's one-row buffers, keep malloc's fast path (an aligned block costs
/// glibc a split).
pub const LINE_ALIGNED_FROM: usize = 16 << 10;
/// A cache line, in bytes.
pub const LINE: usize = 64;

/// [`System`], with blocks of [`LINE_ALIGNED_FROM`] bytes or more aligned to [`LINE`] bytes. Every method maps a
/// layout the same way (by its size and alignment alone), so a block is freed with the layout it was made with.
#[derive(Clone, Copy, Debug, Default)]
pub struct LineAligned;

/// The layout a block of `l` is made with: `l` itself below [`LINE_ALIGNED_FROM`] bytes, else `l` on a line.
fn lined(l: Layout) -> Layout {
    if l.size() < LINE_ALIGNED_FROM || l.align() >= LINE {
        return l;
    }
    // Fails only for sizes within 64 bytes of isize::MAX (no allocation succeeds there anyway): never panic here.
    l.align_to(LINE).unwrap_or(l)
}

// SAFETY: every call forwards to `System` with `lined(layout)`, a valid layout of the same size; `dealloc` and
// `realloc` receive the caller's original layout and map it the same way, so System frees what it made.
unsafe impl GlobalAlloc for LineAligned {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded (a layout of non-zero size, as the caller's).
        unsafe { System.alloc(lined(layout)) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as `alloc`.
        unsafe { System.alloc_zeroed(lined(layout)) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `alloc` with `lined(layout)`.
        unsafe { System.dealloc(ptr, lined(layout)) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let Ok(new) = Layout::from_size_align(new_size, layout.align()) else {
            return std::ptr::null_mut();
        };
        let (old_l, new_l) = (lined(layout), lined(new));
        if old_l.align() == new_l.align() {
            // SAFETY: `ptr` came from System with `old_l`; the alignment is kept, as System's realloc requires.
            return unsafe { System.realloc(ptr, old_l, new_size) };
        }
        // Crossing the threshold changes the alignment: a new block, the bytes both hold, the old block freed.
        // SAFETY: `new_l` has non-zero size (it is at least the smaller of two sizes, one of them >= 16 KiB, and the
        // caller's new size is non-zero by realloc's contract); `ptr` holds `layout.size()` readable bytes.
        unsafe {
            let p = System.alloc(new_l);
            if !p.is_null() {
                std::ptr::copy_nonoverlapping(ptr, p, layout.size().min(new_size));
                System.dealloc(ptr, old_l);
            }
            p
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Blocks from 16 KiB up start on a line; smaller ones keep their own alignment; growing and shrinking across
    /// the threshold keeps the bytes and the rule (each block freed with the layout it was made with).
    #[test]
    fn large_blocks_start_on_a_line_and_keep_their_bytes_across_reallocs() {
        let a = LineAligned;
        for size in [16_384usize, 16_388, 65_536, 1 << 20] {
            for _ in 0..8 {
                let l = Layout::from_size_align(size, 4).unwrap();
                // SAFETY: non-zero size; freed with the same layout.
                unsafe {
                    let p = a.alloc(l);
                    assert!(!p.is_null());
                    assert_eq!(p as usize % LINE, 0, "{size} bytes not on a line");
                    a.dealloc(p, l);
                }
            }
        }
        // SAFETY: every block below is used inside its size and freed with its current layout.
        unsafe {
            let l = Layout::from_size_align(16, 4).unwrap();
            let mut p = a.alloc(l);
            assert!(!p.is_null() && (p as usize).is_multiple_of(4));
            (0..16u8).for_each(|i| *p.add(i as usize) = i);
            let mut size = 16;
            for next in [512, 20_000, 1 << 16, 1000, 8] {
                p = a.realloc(p, Layout::from_size_align(size, 4).unwrap(), next);
                assert!(!p.is_null());
                let kept = 16.min(next) as u8;
                assert!((0..kept).all(|i| *p.add(i as usize) == i), "bytes lost going {size} -> {next}");
                if next >= LINE_ALIGNED_FROM {
                    assert_eq!(p as usize % LINE, 0, "{next} bytes after realloc not on a line");
                }
                size = next;
            }
            a.dealloc(p, Layout::from_size_align(size, 4).unwrap());
            let z = Layout::from_size_align(1 << 16, 4).unwrap();
            let q = a.alloc_zeroed(z);
            assert!((q as usize).is_multiple_of(LINE) && (0..1 << 16).all(|i| *q.add(i) == 0));
            a.dealloc(q, z);
        }
    }
}
