//! The CUDA backend's kernel profile (a measuring aid, `TENSORFOLD_CUDA_PROFILE`): launches and times by kernel.

use cudarc::driver::CudaEvent;
use std::collections::HashMap;

/// Launches the events profile keeps between reports (two CUDA events each): about 350 decode steps of the 24B
/// shape. A process that never reports (`serve`) stops timing there instead of growing without bound.
const EVENTS_MAX: usize = 200_000;

/// Per-kernel launch counts and times. `TENSORFOLD_CUDA_PROFILE=events`: each launch is bracketed by two timing
/// events and nothing waits, so a kernel's time is its own device time (plus the events' cost) and the stream's idle
/// time between launches shows; any other value: each launch is bracketed by syncs (host wall time, seconds).
#[derive(Default)]
pub(crate) struct Profile {
    /// Kernel names by function handle.
    names: HashMap<usize, String>,
    /// (launches, seconds) by kernel name.
    stats: HashMap<String, (u64, f64)>,
    /// Events mode: (kernel, event before, event after) of each launch since the last report.
    events: Option<Vec<(String, CudaEvent, CudaEvent)>>,
    /// Events mode: launches past [`EVENTS_MAX`] since the last report, not timed.
    untimed: u64,
}

impl Profile {
    /// An empty profile, by events or by syncs.
    pub(crate) fn new(events: bool) -> Self {
        Profile { events: events.then(Vec::new), ..Profile::default() }
    }

    /// Records the name of a loaded kernel.
    pub(crate) fn name(&mut self, func: usize, name: &str) {
        self.names.insert(func, name.to_string());
    }

    /// How the next launch is timed: (between syncs, by events). Counts a launch the full events profile skips.
    pub(crate) fn mode(&mut self) -> (bool, bool) {
        match self.events.as_ref().map(|e| e.len() < EVENTS_MAX) {
            None => (true, false),
            Some(true) => (false, true),
            Some(false) => {
                self.untimed += 1;
                (false, false)
            }
        }
    }

    /// A launch of `func` timed between syncs: `secs` of host wall time.
    pub(crate) fn timed(&mut self, func: usize, secs: f64) {
        let name = self.names.get(&func).cloned().unwrap_or_default();
        let e = self.stats.entry(name).or_default();
        (e.0, e.1) = (e.0 + 1, e.1 + secs);
    }

    /// A launch of `func` bracketed by two recorded events.
    pub(crate) fn evented(&mut self, func: usize, before: CudaEvent, after: CudaEvent) {
        let name = self.names.get(&func).cloned().unwrap_or_default();
        self.events.get_or_insert_with(Vec::new).push((name, before, after));
    }

    /// The table (kernel, launches, total ms, µs a launch; largest first), cleared. `synced`: the stream has
    /// finished every recorded event (else the events are not read).
    pub(crate) fn report(&mut self, synced: bool) -> String {
        let head = match self.events.take() {
            Some(ev) => {
                self.events = Some(Vec::new());
                let head = self.read_events(&ev, synced);
                match std::mem::take(&mut self.untimed) {
                    0 => head,
                    n => format!("{head}; {n} later launches not timed"),
                }
            }
            None => "synchronized per launch".to_string(),
        };
        let mut rows: Vec<(String, (u64, f64))> = self.stats.drain().collect();
        rows.sort_by(|a, b| b.1.1.total_cmp(&a.1.1));
        let total: f64 = rows.iter().map(|r| r.1.1).sum();
        let mut out = format!("kernel profile ({head}), {:.3} ms in all:\n", total * 1e3);
        for (name, (n, s)) in rows {
            out += &format!("  {name:<32} {n:>8} launches {:>10.3} ms {:>9.1} us each\n", s * 1e3, s * 1e6 / n as f64);
        }
        out
    }

    /// Per-kernel device seconds of `ev` into the stats, and a head line: the span from the first launch's start to
    /// the last one's end, the time inside kernels, and the rest (the stream idle, waiting for the host, or running
    /// copies and memsets).
    fn read_events(&mut self, ev: &[(String, CudaEvent, CudaEvent)], synced: bool) -> String {
        let (Some(first), Some(last), true) = (ev.first(), ev.last(), synced) else {
            return "device events: none readable".to_string();
        };
        let mut busy = 0f64;
        for (name, a, b) in ev {
            let ms = a.elapsed_ms(b).unwrap_or(0.0) as f64;
            busy += ms;
            let e = self.stats.entry(name.clone()).or_default();
            (e.0, e.1) = (e.0 + 1, e.1 + ms * 1e-3);
        }
        let span = first.1.elapsed_ms(&last.2).unwrap_or(0.0) as f64;
        format!(
            "device time by events, {} launches: span {span:.3} ms, in kernels {busy:.3} ms, between them {:.3} ms",
            ev.len(),
            span - busy
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_synced_profile_sums_by_kernel_name_and_clears_on_report() {
        let mut p = Profile::new(false);
        assert_eq!(p.mode(), (true, false));
        p.name(7, "linear_bf16_v8");
        p.timed(7, 0.002);
        p.timed(7, 0.004);
        p.timed(9, 0.001);
        let r = p.report(true);
        assert!(r.starts_with("kernel profile (synchronized per launch), 7.000 ms in all:"), "{r}");
        assert!(r.contains("linear_bf16_v8") && r.contains("2 launches") && r.contains("3000.0 us each"), "{r}");
        assert!(p.report(true).contains("0.000 ms in all"), "a report clears the table");
    }

    #[test]
    fn the_events_profile_times_by_events_and_reads_none_before_a_sync() {
        let mut p = Profile::new(true);
        assert_eq!(p.mode(), (false, true));
        assert!(p.report(true).contains("device events: none readable"));
        assert_eq!(p.mode(), (false, true), "a report keeps the events mode");
    }
}
