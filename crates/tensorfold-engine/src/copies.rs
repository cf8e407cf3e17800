//! Context copies (drafts that continue an earlier occurrence of the context's last tokens) and the stream guard
//! that stops a stream drafting where its drafts keep being rejected.

/// The tokens that followed the most recent earlier occurrence of `history`'s last `min_match` tokens,
/// at most `max` of them. Empty when there is no such occurrence (or `min_match` is 0).
pub fn context_copy(history: &[u32], min_match: usize, max: usize) -> Vec<u32> {
    let n = history.len();
    if min_match == 0 || max == 0 || n <= min_match {
        return Vec::new();
    }
    let key = &history[n - min_match..];
    // Latest start first: the most recent occurrence predicts best in repetitive text.
    (0..n - min_match)
        .rev()
        .find(|&s| &history[s..s + min_match] == key)
        .map(|s| history[s + min_match..(s + min_match + max).min(n)].to_vec())
        .unwrap_or_default()
}

/// The per-stream guard: after two windows in a row with no accepted draft, drafting pauses for a
/// number of rounds that doubles (4 up to 64) while windows keep failing; one accepted draft resets it.
#[derive(Clone, Debug, Default)]
pub struct StreamGuard {
    misses: u32,
    pause: u32,
    backoff: u32,
}

impl StreamGuard {
    /// Whether this round may propose drafts (counts a paused round).
    pub fn allow(&mut self) -> bool {
        if self.pause > 0 {
            self.pause -= 1;
            return false;
        }
        true
    }

    /// Records a verified window: `accepted` of its drafts were kept.
    pub fn record(&mut self, accepted: usize) {
        if accepted > 0 {
            *self = Self::default();
            return;
        }
        self.misses += 1;
        if self.misses >= 2 {
            self.backoff = (self.backoff * 2).clamp(4, 64);
            self.pause = self.backoff;
            self.misses = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_continues_the_latest_earlier_occurrence() {
        let h = [1, 2, 3, 9, 1, 2, 3, 7, 8, 5, 1, 2, 3];
        assert_eq!(context_copy(&h, 3, 2), vec![7, 8]);
        assert_eq!(context_copy(&h, 3, 10), vec![7, 8, 5, 1, 2, 3]);
        assert_eq!(context_copy(&h, 4, 2), Vec::<u32>::new(), "no earlier [5,1,2,3]... only [9,1,2,3]");
        assert_eq!(context_copy(&h, 0, 2), Vec::<u32>::new());
    }

    #[test]
    fn the_guard_pauses_after_two_empty_windows_and_doubles() {
        let mut g = StreamGuard::default();
        g.record(0);
        assert!(g.allow());
        g.record(0);
        assert_eq!((0..4).filter(|_| !g.allow()).count(), 4);
        assert!(g.allow());
        g.record(0);
        g.record(0);
        assert_eq!((0..8).filter(|_| !g.allow()).count(), 8);
        g.record(2);
        assert!(g.allow());
    }
}
