//! A deterministic cache of freed device blocks by size class, so a decode step gets the same addresses every time
//! and its recorded sequence repeats (a CUDA graph replays only an exact repeat; the driver's pool hands out
//! different addresses from one step to the next, measured on the H200).

use std::collections::HashMap;

/// Largest block kept: a decode round's activations and logits (64 rows of a 65,536-token vocabulary are 16 MiB);
/// larger blocks (long prefills, KV caches, weights) go back to the driver.
pub(crate) const BLOCK_MAX: usize = 256 << 20;
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

#[cfg(test)]
mod tests {
    use super::*;

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
