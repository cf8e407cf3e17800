//! Stop strings over streamed text: matched across token boundaries, and text that is (or may still
//! become) a stop string is held back, never streamed.

/// Streams text through a set of stop strings.
#[derive(Debug, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
}

impl StopMatcher {
    /// A matcher for `stops` (empty strings must be refused before).
    pub fn new(stops: Vec<String>) -> Self {
        Self { stops, held: String::new() }
    }

    /// Adds `piece`; returns the text safe to release and whether a stop string ended the reply (the stop
    /// string and anything after it are dropped).
    pub fn push(&mut self, piece: &str) -> (String, bool) {
        self.held.push_str(piece);
        if let Some(at) = self.stops.iter().filter_map(|s| self.held.find(s.as_str())).min() {
            let out = self.held[..at].to_string();
            self.held.clear();
            return (out, true);
        }
        let keep = self.held_suffix();
        let cut = self.held.len() - keep;
        let out = self.held[..cut].to_string();
        self.held.drain(..cut);
        (out, false)
    }

    /// Releases whatever is held (the reply ended without a stop string).
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// Length of the longest suffix of the held text that is a proper prefix of some stop string.
    fn held_suffix(&self) -> usize {
        self.held
            .char_indices()
            .map(|(i, _)| i)
            .find(|&i| self.stops.iter().any(|s| s.starts_with(&self.held[i..])))
            .map_or(0, |i| self.held.len() - i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = String::new();
        for p in pieces {
            let (o, stop) = m.push(p);
            out += &o;
            if stop {
                return (out, true);
            }
        }
        out += &m.finish();
        (out, false)
    }

    #[test]
    fn a_stop_string_split_across_pieces_is_found_and_never_released() {
        assert_eq!(run(&["END"], &["abc E", "N", "D tail"]), ("abc ".into(), true));
    }

    #[test]
    fn a_prefix_that_does_not_become_a_stop_is_released_later() {
        let mut m = StopMatcher::new(vec!["END".into()]);
        assert_eq!(m.push("abc EN"), ("abc ".into(), false));
        assert_eq!(m.push("x"), ("ENx".into(), false));
    }

    #[test]
    fn the_earliest_of_several_stops_wins_and_multibyte_text_is_split_on_char_boundaries() {
        assert_eq!(run(&["世界", "b"], &["a世", "界b"]), ("a".into(), true));
        assert_eq!(run(&["é!"], &["café", " ok"]), ("café ok".into(), false));
    }

    #[test]
    fn without_stops_everything_passes_through() {
        assert_eq!(run(&[], &["a", "b"]), ("ab".into(), false));
    }
}
