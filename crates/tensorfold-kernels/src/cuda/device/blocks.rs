//! What happens to freed device memory while operations are deferred: a deterministic cache of freed blocks by size
//! class, so a decode step gets the same addresses every time and its recorded sequence repeats (a CUDA graph
//! replays only an exact repeat; the driver's pool hands out different addresses from one step to the next,
//! measured on the H200), and frees held back until the queued operations that may use the memory are issued (the
//! driver refuses a copy to a freed address).

use cudarc::driver::CudaSlice;
use std::collections::HashMap;

/// Largest block kept: a decode round's activations and logits (64 rows of a 65,536-token vocabulary are 16 MiB);
/// larger blocks (long prefills, KV caches, weights) go back to the driver.
pub(crate) const BLOCK_MAX: usize = 256 << 20;
/// Bytes held back behind the queue before an allocation flushes it: a long prefill's large activations would
/// otherwise all stay allocated until its end. Blocks of up to [`BLOCK_MAX`] go to the cache instead, so a decode
/// step never reaches it.
pub(crate) const HELD_MAX: usize = 256 << 20;
/// Bytes kept in all; past it the block freed longest ago goes back to the driver.
pub(crate) const CACHE_MAX: usize = 2 << 30;

/// The size a request of `bytes` is allocated as: a multiple of 512 bytes, so near sizes share blocks.
pub(crate) fn class(bytes: usize) -> usize {
    bytes.next_multiple_of(512)
}

/// Freed blocks by size class, each list last-in first-out, with the tick each was freed at. The same sequence of
/// takes and puts from the same state gives the same blocks: nothing here depends on timing.
pub(crate) struct BlockCache<S> {
    lists: HashMap<usize, Vec<(S, u64)>>,
    bytes: usize,
    tick: u64,
}

impl<S> Default for BlockCache<S> {
    fn default() -> Self {
        BlockCache { lists: HashMap::new(), bytes: 0, tick: 0 }
    }
}

impl<S> BlockCache<S> {
    /// The block freed last of class `class`, if any.
    pub(crate) fn take(&mut self, class: usize) -> Option<S> {
        let (s, _) = self.lists.get_mut(&class)?.pop()?;
        self.bytes -= class;
        Some(s)
    }

    /// Keeps `s` (of `class` bytes, at most [`BLOCK_MAX`]); returns the blocks that no longer fit, freed longest ago
    /// first, for the caller to give back to the driver.
    pub(crate) fn put(&mut self, class: usize, s: S) -> Vec<S> {
        self.tick += 1;
        self.lists.entry(class).or_default().push((s, self.tick));
        self.bytes += class;
        let mut out = Vec::new();
        while self.bytes > CACHE_MAX {
            let Some(oldest) = self.lists.iter().filter_map(|(c, v)| v.first().map(|(_, t)| (*t, *c))).min() else {
                break;
            };
            let (s, _) = self.lists.get_mut(&oldest.1).map(|v| v.remove(0)).expect("the list just seen");
            self.bytes -= oldest.1;
            out.push(s);
        }
        out
    }

    /// Every block, for the caller to give back (out of memory: the driver may need them).
    pub(crate) fn drain(&mut self) -> Vec<S> {
        self.bytes = 0;
        self.lists.drain().flat_map(|(_, v)| v.into_iter().map(|(s, _)| s)).collect()
    }

    /// Bytes kept.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }
}

/// Device memory as the reclaim policy sees it.
pub(crate) trait Block {
    /// Its size in bytes.
    fn bytes(&self) -> usize;
}

impl Block for CudaSlice<u8> {
    fn bytes(&self) -> usize {
        self.len()
    }
}

/// The policy for dropped blocks: kept in the [`BlockCache`] (while deferred, up to [`BLOCK_MAX`] each), else given
/// back to the driver (dropped) at once, or after the next flush when operations are queued. Generic over the block
/// so it is tested without a GPU.
pub(crate) struct Reclaim<S> {
    deferred: bool,
    /// Blocks to give back after the queued operations are issued.
    freed: Vec<S>,
    freed_bytes: usize,
    cache: BlockCache<S>,
}

impl<S: Block> Reclaim<S> {
    /// The policy of a device whose operations are `deferred` (else nothing is cached or held back).
    pub(crate) fn new(deferred: bool) -> Self {
        Reclaim { deferred, freed: Vec::new(), freed_bytes: 0, cache: BlockCache::default() }
    }

    /// The bytes an allocation of `bytes` takes, and whether it comes from (and goes back to) the cache.
    pub(crate) fn size(&self, bytes: usize) -> (usize, bool) {
        match self.deferred && bytes <= BLOCK_MAX {
            true => (class(bytes), true),
            false => (bytes, false),
        }
    }

    /// A cached block of `size` bytes (a class), if one is kept.
    pub(crate) fn take(&mut self, size: usize) -> Option<S> {
        self.cache.take(size)
    }

    /// A dropped block; `queued`: operations that may use it are waiting to be issued.
    pub(crate) fn release(&mut self, s: S, queued: bool) {
        let n = s.bytes();
        if self.size(n) == (n, true) {
            for old in self.cache.put(n, s) {
                self.give_back(old, queued);
            }
            return;
        }
        self.give_back(s, queued);
    }

    fn give_back(&mut self, s: S, queued: bool) {
        if !queued {
            return drop(s);
        }
        self.freed_bytes += s.bytes();
        self.freed.push(s);
    }

    /// The queue was issued: the held-back blocks go to the driver, ordered after the operations that used them.
    pub(crate) fn flushed(&mut self) {
        self.freed.clear();
        self.freed_bytes = 0;
    }

    /// Whether operations are deferred (the device's one flag).
    pub(crate) fn deferred(&self) -> bool {
        self.deferred
    }

    /// Deferral switched on or off (before the device allocates anything).
    #[cfg(feature = "planted-faults")]
    pub(crate) fn set_deferred(&mut self, deferred: bool) {
        self.deferred = deferred;
    }

    /// Every cached block back to the driver at once: only after a settle (out of device memory), when nothing
    /// is queued.
    pub(crate) fn uncache(&mut self) {
        for s in self.cache.drain() {
            self.give_back(s, false);
        }
    }

    /// Bytes held back until the next flush.
    #[cfg(test)]
    pub(crate) fn held_bytes(&self) -> usize {
        self.freed_bytes
    }

    /// Whether an allocation should flush the queue first: more than [`HELD_MAX`] bytes are held back.
    pub(crate) fn must_flush(&self) -> bool {
        self.freed_bytes > HELD_MAX
    }

    /// Bytes kept in the cache.
    pub(crate) fn cached_bytes(&self) -> usize {
        self.cache.bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::rc::Rc;

    /// A block that logs its id when given back (dropped).
    struct Fake(usize, u32, Rc<RefCell<Vec<u32>>>);

    impl Block for Fake {
        fn bytes(&self) -> usize {
            self.0
        }
    }

    impl Drop for Fake {
        fn drop(&mut self) {
            self.2.borrow_mut().push(self.1);
        }
    }

    #[test]
    fn a_block_dropped_while_operations_are_queued_is_given_back_only_after_the_flush() {
        let log = Rc::new(RefCell::new(Vec::new()));
        let big = BLOCK_MAX + 512;
        let mut r = Reclaim::new(true);
        r.release(Fake(big, 1, log.clone()), true);
        assert!(log.borrow().is_empty(), "a queued copy may still use it");
        assert_eq!(r.held_bytes(), big);
        assert!(r.must_flush(), "over 256 MiB held: the next allocation flushes");
        r.flushed();
        assert!(!r.must_flush() && r.held_bytes() == 0);
        assert_eq!(*log.borrow(), vec![1]);
        r.release(Fake(big, 2, log.clone()), false);
        assert_eq!(*log.borrow(), vec![1, 2], "nothing queued: at once");
    }

    #[test]
    fn deferred_small_blocks_are_kept_and_come_back_to_the_same_class_only() {
        let log = Rc::new(RefCell::new(Vec::new()));
        let mut r = Reclaim::new(true);
        assert_eq!(r.size(1000), (1024, true));
        r.release(Fake(1024, 7, log.clone()), true);
        r.flushed();
        assert!(log.borrow().is_empty(), "kept, not given back");
        assert!(r.take(1536).is_none());
        assert_eq!(r.take(1024).map(|b| b.1), Some(7));
        assert_eq!(*log.borrow(), vec![7], "the taken block, dropped by this test");
    }

    #[test]
    fn a_block_evicted_from_a_full_cache_while_queued_waits_for_the_flush() {
        let log = Rc::new(RefCell::new(Vec::new()));
        let mut r = Reclaim::new(true);
        let n = CACHE_MAX / BLOCK_MAX;
        for i in 0..n as u32 {
            r.release(Fake(BLOCK_MAX, i, log.clone()), false);
        }
        r.release(Fake(512, 99, log.clone()), true);
        assert!(log.borrow().is_empty(), "block 0 is evicted but may still be in use");
        r.flushed();
        assert_eq!(*log.borrow(), vec![0]);
        r.uncache();
        assert_eq!(log.borrow().len(), n + 1);
        assert_eq!(r.cached_bytes(), 0);
    }

    #[test]
    fn without_deferral_nothing_is_kept_or_held() {
        let log = Rc::new(RefCell::new(Vec::new()));
        let mut r = Reclaim::new(false);
        assert_eq!(r.size(1000), (1000, false));
        r.release(Fake(1000, 3, log.clone()), false);
        assert_eq!(*log.borrow(), vec![3]);
    }

    /// A fake driver: hands out fresh addresses; `step` allocates and frees as a forward would.
    fn step(c: &mut BlockCache<u64>, next: &mut u64, sizes: &[usize]) -> Vec<u64> {
        let mut got = Vec::new();
        for &s in sizes {
            let a = c.take(class(s)).unwrap_or_else(|| {
                *next += 1 << 30;
                *next
            });
            got.push(a);
        }
        // Freed in a different order than taken, as buffers go out of scope.
        for (i, &a) in got.iter().enumerate().rev() {
            assert!(c.put(class(sizes[i]), a).is_empty());
        }
        got
    }

    #[test]
    fn the_same_steps_get_the_same_addresses() {
        let (mut c, mut next) = (BlockCache::default(), 0u64);
        let sizes = [8192, 100, 8192, 4 << 20, 100, 8000];
        let first = step(&mut c, &mut next, &sizes);
        let second = step(&mut c, &mut next, &sizes);
        assert_eq!(step(&mut c, &mut next, &sizes), second);
        assert_eq!(step(&mut c, &mut next, &sizes), second);
        assert_eq!(first, second, "every block came back, so the second step reuses the first's");
        assert_eq!(class(8000), 8192);
        assert_eq!(c.bytes(), 2 * 8192 + 8192 + (4 << 20) + 2 * 512);
    }

    #[test]
    fn past_the_cap_the_block_freed_longest_ago_goes_back() {
        let mut c = BlockCache::default();
        let big = BLOCK_MAX;
        for i in 0..(CACHE_MAX / big) as u64 {
            assert!(c.put(big, i).is_empty());
        }
        assert_eq!(c.put(512, 99), vec![0], "the first big block freed");
        assert_eq!(c.bytes(), CACHE_MAX - big + 512);
        assert_eq!(c.take(512), Some(99));
        assert_eq!(c.take(big), Some((CACHE_MAX / big) as u64 - 1), "last in, first out");
        assert_eq!(c.drain().len(), CACHE_MAX / big - 2);
        assert_eq!((c.bytes(), c.take(big)), (0, None));
    }
}
