//! Draft scheduling from measurements: the depth rule (how many drafts a verify window carries), the
//! confidence-scheduled verify (DSpark's Algorithm 1), and the shared-round guard (plain or drafted rounds
//! for each stream count). All decisions come from measured acceptance and round wall time.

use std::collections::{BTreeMap, HashMap};

/// How many drafts each window carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum VerifyMode {
    /// The depth with the most expected committed tokens per second of round, from moving averages of
    /// per-position acceptance and round cost, probing one deeper every [`PROBE_EVERY`] rounds.
    #[default]
    Depth,
    /// DSpark's Algorithm 1 over the round's streams, from the drafter's confidence head.
    Scheduled,
    /// Always `max_draft` (measurement runs: acceptance at a fixed block).
    Fixed,
}

/// Rounds between probes one deeper than the chosen depth.
pub const PROBE_EVERY: u64 = 16;
/// Weight of a new observation in the moving averages.
const ALPHA: f64 = 0.1;

/// Moving averages of per-position acceptance and of round wall time by rows.
#[derive(Clone, Debug, Default)]
pub struct CostModel {
    /// `accept[k]`: P(draft k accepted | drafts before it accepted), moving average.
    accept: Vec<f64>,
    /// Round seconds by rows in the round, moving average.
    cost: BTreeMap<usize, f64>,
    rounds: u64,
}

impl CostModel {
    /// Records a verify window of `drafted` drafts of which the first `accepted` were kept.
    pub fn record_window(&mut self, drafted: usize, accepted: usize) {
        for k in 0..drafted.min(accepted + 1) {
            let hit = if k < accepted { 1.0 } else { 0.0 };
            match self.accept.get_mut(k) {
                Some(a) => *a += ALPHA * (hit - *a),
                None => self.accept.push(0.5 + ALPHA * (hit - 0.5)),
            }
        }
    }

    /// Records a round of `rows` rows that took `secs` of wall time (zero-length rounds are ignored).
    pub fn record_round(&mut self, rows: usize, secs: f64) {
        self.rounds += 1;
        if secs > 0.0 && rows > 0 {
            let c = self.cost.entry(rows).or_insert(secs);
            *c += ALPHA * (secs - *c);
        }
    }

    /// Conditional acceptance at position k (a prior of 0.5 where nothing was measured).
    pub fn acceptance(&self, k: usize) -> f64 {
        self.accept.get(k).copied().unwrap_or(0.5)
    }

    /// Expected committed tokens of a window with `d` drafts: 1 + sum over k of P(drafts 0..=k kept).
    pub fn expected_tokens(&self, d: usize) -> f64 {
        let mut survive = 1.0;
        let mut e = 1.0;
        for k in 0..d {
            survive *= self.acceptance(k);
            e += survive;
        }
        e
    }

    /// Estimated seconds of a round of `rows` rows: the measured average, else linear between the nearest
    /// measured row counts, else the nearest one (flat). `None` without any measurement.
    pub fn round_cost(&self, rows: usize) -> Option<f64> {
        let below = self.cost.range(..=rows).next_back();
        let above = self.cost.range(rows..).next();
        match (below, above) {
            (Some((&r0, &c0)), Some((&r1, &c1))) if r1 > r0 => {
                Some(c0 + (c1 - c0) * (rows - r0) as f64 / (r1 - r0) as f64)
            }
            (Some((_, &c)), _) | (None, Some((_, &c))) => Some(c),
            (None, None) => None,
        }
    }

    /// The depth rule: for `streams` drafting streams beside `other_rows` rows, the depth in `1..=max` with
    /// the most expected committed tokens per second; every [`PROBE_EVERY`] rounds, one deeper.
    pub fn depth(&self, streams: usize, other_rows: usize, max: usize) -> usize {
        if max == 0 || streams == 0 {
            return 0;
        }
        // The other streams' rows commit a token each whatever the depth: they count in the rate too.
        let rate = |d: usize| {
            let cost = self.round_cost(other_rows + streams * (1 + d)).unwrap_or(1.0);
            (streams as f64 * self.expected_tokens(d) + other_rows as f64) / cost
        };
        let best = (1..=max).fold(1, |b, d| if rate(d) > rate(b) { d } else { b });
        if self.rounds % PROBE_EVERY == PROBE_EVERY - 1 { (best + 1).min(max) } else { best }
    }

    /// DSpark's Algorithm 1: given each stream's draft confidences `conf[r]` (conditional acceptance per
    /// draft), the drafts to verify per stream. Starts from one row a stream, admits drafts by survival
    /// (product of confidences) while expected tokens per second improves, and stops at the first that
    /// does not (stopping early keeps the sampled case lossless).
    pub fn scheduled(&self, conf: &[Vec<f32>], other_rows: usize) -> Vec<usize> {
        let n = conf.len();
        let mut pairs: Vec<(f64, usize, usize)> = Vec::new();
        for (r, c) in conf.iter().enumerate() {
            let mut a = 1.0;
            for (j, &p) in c.iter().enumerate() {
                // A non-finite confidence says nothing: it counts as no chance of acceptance.
                a *= if p.is_finite() { p.clamp(0.0, 1.0) as f64 } else { 0.0 };
                pairs.push((a, r, j));
            }
        }
        // Survival is non-increasing within a stream, so a stable sort admits each stream's drafts in order.
        pairs.sort_by(|x, y| y.0.total_cmp(&x.0));
        let sps = |rows: usize| 1.0 / self.round_cost(rows).unwrap_or(1.0);
        let (mut rows, mut tau) = (n + other_rows, (n + other_rows) as f64);
        let mut best = tau * sps(rows);
        let mut take = vec![0usize; n];
        for (a, r, j) in pairs {
            let gain = (tau + a) * sps(rows + 1);
            if gain <= best || j != take[r] {
                break;
            }
            (rows, tau, best) = (rows + 1, tau + a, gain);
            take[r] += 1;
        }
        take
    }
}

/// A round's mode under the shared-round guard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// No drafts at all (no drafter pass, no context copies).
    Plain,
    /// Drafts verified in windows.
    Drafted,
}

/// Plain rounds measured before a decision, and drafted ones.
pub const MEASURE_PLAIN: u64 = 16;
/// Drafted rounds measured before a decision.
pub const MEASURE_DRAFTED: u64 = 4;
/// Rounds the faster mode runs before the other is measured again (doubling while it keeps winning).
pub const STRETCH: u64 = 512;
/// Most doublings of a stretch.
pub const MAX_DOUBLINGS: u32 = 6;
/// Drafted rounds must beat plain ones by this factor of committed tokens per second.
pub const DRAFT_MARGIN: f64 = 1.05;

#[derive(Clone, Debug, Default)]
struct Rate {
    tokens: u64,
    secs: f64,
    rounds: u64,
}

impl Rate {
    fn per_sec(&self) -> f64 {
        if self.secs > 0.0 { self.tokens as f64 / self.secs } else { 0.0 }
    }
}

#[derive(Clone, Debug)]
struct CountGuard {
    mode: Mode,
    /// The mode the guard runs between measurements (`None` before the first decision).
    winner: Option<Mode>,
    /// Rounds left in the current stretch of the winner.
    left: u64,
    doublings: u32,
    /// The last round ran another mode (this round is the mode's first: not measured).
    fresh: bool,
    plain: Rate,
    drafted: Rate,
}

/// The shared-round guard: for each stream count, committed tokens over wall time in plain and drafted
/// rounds; it starts plain, measures 16 plain and 4 drafted rounds, runs the faster mode for 512 rounds
/// (doubling while the same mode wins, up to 64x: 6 doublings), then measures the other mode again. Drafted must
/// beat plain by 5%. A mode's first round (which still carries the other mode's rows) is not measured.
#[derive(Clone, Debug, Default)]
pub struct RoundGuard {
    counts: HashMap<usize, CountGuard>,
}

impl RoundGuard {
    /// The mode of the next round with `streams` decoding streams.
    pub fn mode(&mut self, streams: usize) -> Mode {
        self.counts
            .entry(streams)
            .or_insert(CountGuard {
                mode: Mode::Plain,
                winner: None,
                left: 0,
                doublings: 0,
                fresh: true,
                plain: Rate::default(),
                drafted: Rate::default(),
            })
            .mode
    }

    /// Records a round run in `mode` with `streams` decoding streams that committed `tokens` in `secs`.
    pub fn record(&mut self, streams: usize, mode: Mode, tokens: u64, secs: f64) {
        let Some(g) = self.counts.get_mut(&streams) else { return };
        if g.mode != mode {
            return;
        }
        let measuring = g.winner.is_none() || g.left == 0;
        if g.fresh {
            g.fresh = false;
        } else if measuring || g.winner == Some(mode) {
            let r = if mode == Mode::Plain { &mut g.plain } else { &mut g.drafted };
            r.tokens += tokens;
            r.secs += secs;
            r.rounds += 1;
        }
        g.step(mode);
    }
}

impl CountGuard {
    /// Advances the state machine after a recorded round in `mode`.
    fn step(&mut self, mode: Mode) {
        let quota = |m: Mode| if m == Mode::Plain { MEASURE_PLAIN } else { MEASURE_DRAFTED };
        let rate = |g: &Self, m: Mode| if m == Mode::Plain { g.plain.rounds } else { g.drafted.rounds };
        match self.winner {
            Some(w) if self.left > 0 => {
                self.left -= 1;
                if self.left == 0 {
                    let other = if w == Mode::Plain { Mode::Drafted } else { Mode::Plain };
                    *self.rate_mut(other) = Rate::default();
                    self.switch(other);
                }
            }
            _ if rate(self, mode) < quota(mode) => {}
            None if mode == Mode::Plain => self.switch(Mode::Drafted),
            _ => self.decide(),
        }
    }

    fn rate_mut(&mut self, m: Mode) -> &mut Rate {
        if m == Mode::Plain { &mut self.plain } else { &mut self.drafted }
    }

    fn switch(&mut self, m: Mode) {
        if self.mode != m {
            self.mode = m;
            self.fresh = true;
        }
    }

    /// Both modes measured: run the faster for a stretch (doubling while the same mode keeps winning).
    fn decide(&mut self) {
        let drafted_wins = self.drafted.per_sec() > DRAFT_MARGIN * self.plain.per_sec();
        let w = if drafted_wins { Mode::Drafted } else { Mode::Plain };
        if self.winner == Some(w) {
            self.doublings = (self.doublings + 1).min(MAX_DOUBLINGS);
        } else {
            self.doublings = 0;
        }
        self.winner = Some(w);
        self.left = STRETCH << self.doublings;
        // The winner's stretch is measured afresh; the loser keeps its figure until re-measured.
        *self.rate_mut(w) = Rate::default();
        self.switch(w);
    }
}
