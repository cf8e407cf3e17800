//! The prompt cache: stream states kept at planned points (chunk boundaries and prompt ends), keyed by the
//! token prefix they consumed, evicted least-recently-used within a byte budget.

/// Lookup counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheCounters {
    /// Lookups.
    pub queries: u64,
    /// Lookups that resumed from a kept state.
    pub hits: u64,
    /// Prompt tokens not recomputed thanks to hits.
    pub reused_tokens: u64,
}

struct Entry<S> {
    tokens: Vec<u32>,
    state: S,
    bytes: usize,
    last_used: u64,
}

/// Kept states of type `S`.
pub struct PromptCache<S> {
    entries: Vec<Entry<S>>,
    budget: usize,
    used: usize,
    tick: u64,
    /// Counters.
    pub counters: CacheCounters,
}

impl<S: Clone> PromptCache<S> {
    /// An empty cache holding at most `budget` bytes (0 = off).
    pub fn new(budget: usize) -> Self {
        Self { entries: Vec::new(), budget, used: 0, tick: 0, counters: CacheCounters::default() }
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.used
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The longest kept prefix of `prompt` that leaves at least one row to compute: its state (for the caller to
    /// copy, `Target::snapshot`: a device copy under the target's watch) and its length. Counts a query; the caller
    /// counts the hit once its copy is made ([`PromptCache::resumed`]).
    pub fn lookup(&mut self, prompt: &[u32]) -> Option<(&S, usize)> {
        self.counters.queries += 1;
        self.tick += 1;
        let best = self
            .entries
            .iter_mut()
            .filter(|e| e.tokens.len() < prompt.len() && prompt.starts_with(&e.tokens))
            .max_by_key(|e| e.tokens.len())?;
        best.last_used = self.tick;
        Some((&best.state, best.tokens.len()))
    }

    /// Counts a hit: a request resumed from a kept state after `tokens` prompt tokens.
    pub fn resumed(&mut self, tokens: usize) {
        self.counters.hits += 1;
        self.counters.reused_tokens += tokens as u64;
    }

    /// True when a state after exactly `tokens` is kept.
    pub fn contains(&self, tokens: &[u32]) -> bool {
        self.entries.iter().any(|e| e.tokens == tokens)
    }

    /// Keeps `state` (of `bytes`) as the state after `tokens`, evicting least-recently-used entries to stay
    /// in budget. A state larger than the budget, or one already kept, is not stored.
    pub fn insert(&mut self, tokens: &[u32], state: S, bytes: usize) {
        if bytes > self.budget || self.entries.iter().any(|e| e.tokens == tokens) {
            return;
        }
        while self.used + bytes > self.budget {
            let Some(i) = self.entries.iter().enumerate().min_by_key(|(_, e)| e.last_used).map(|(i, _)| i) else {
                break;
            };
            self.used -= self.entries.swap_remove(i).bytes;
        }
        self.tick += 1;
        self.used += bytes;
        self.entries.push(Entry { tokens: tokens.to_vec(), state, bytes, last_used: self.tick });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_prefix_that_leaves_a_row_wins() {
        let mut c = PromptCache::new(1000);
        c.insert(&[1, 2], "ab", 10);
        c.insert(&[1, 2, 3, 4], "abcd", 10);
        c.insert(&[1, 2, 3, 4, 5], "abcde", 10);
        assert_eq!(c.lookup(&[1, 2, 3, 4, 5]), Some((&"abcd", 4)));
        assert_eq!(c.lookup(&[1, 2, 9]), Some((&"ab", 2)));
        assert_eq!(c.lookup(&[7]), None);
        assert_eq!(c.counters, CacheCounters { queries: 3, hits: 0, reused_tokens: 0 }, "hits count once resumed");
        c.resumed(4);
        c.resumed(2);
        assert_eq!(c.counters, CacheCounters { queries: 3, hits: 2, reused_tokens: 6 });
    }

    #[test]
    fn eviction_drops_the_least_recently_used_within_the_budget() {
        let mut c = PromptCache::new(25);
        c.insert(&[1], 1, 10);
        c.insert(&[2], 2, 10);
        assert!(c.lookup(&[1, 5]).is_some());
        c.insert(&[3], 3, 10);
        assert_eq!(c.len(), 2);
        assert!(c.lookup(&[2, 5]).is_none(), "entry [2] was least recently used");
        assert!(c.lookup(&[1, 5]).is_some());
        assert!(c.bytes() <= 25);
    }

    #[test]
    fn a_zero_budget_keeps_nothing() {
        let mut c = PromptCache::new(0);
        c.insert(&[1], 1, 1);
        assert!(c.is_empty());
        assert!(c.lookup(&[1, 2]).is_none());
    }
}
