//! Memory admission's budget (`--memory-gib`): a fixed size on the host; on a GPU by default what the device has
//! left once the weights are loaded, so a thousand streams fit where the memory does.

use anyhow::bail;
use tensorfold_kernels::Backend;
use tensorfold_model::Model;

/// Share of the device memory free after the load given to streams and rounds; the rest absorbs the allocator's
/// rounding and its kept blocks (vLLM's `gpu_memory_utilization` defaults to 0.9 of the whole device).
pub const DEVICE_SHARE: f64 = 0.9;

/// What decides the budget: the flag's value, and what the caller reserves besides the streams.
pub struct BudgetAsk {
    /// `--memory-gib` when given.
    pub gib: Option<f64>,
    /// The budget on the host when `gib` is not given.
    pub host_gib: f64,
    /// Bytes the prompt cache may hold (on the device with the streams' states).
    pub prompt_cache_bytes: usize,
    /// The row budget of a round (`EngineConfig::round_rows`).
    pub round_rows: usize,
    /// Lanes: every one may add a decode row past the budget, and a drafter's block pass runs a block for each.
    pub parallel: usize,
    /// Rows of the longest verify window (`EngineConfig::verify_rows`): the conv window each stream keeps.
    pub verify_rows: usize,
}

/// The budget and how it was chosen.
pub struct Budget {
    /// Bytes the streams' states may hold together (`EngineConfig::memory_bytes`).
    pub bytes: usize,
    /// A line for the log.
    pub how: String,
}

/// The streams' budget: `gib` when given; on the host `host_gib`; on a device `DEVICE_SHARE` of what the backend
/// says streams and rounds can still take (`Backend::memory_free`), less the prompt cache and the activations of the
/// widest round and of a drafter's block pass over every lane (`Model::round_bytes`; each stream's estimate also
/// counts a decode row of its own, so a lane's row is counted twice: on the safe side). Errors: a given value that
/// is not positive or leaves no room for one stream of one token, or a device with no such room.
pub fn stream_budget<B: Backend>(model: &Model<B>, ask: &BudgetAsk) -> anyhow::Result<Budget> {
    if let Some(g) = ask.gib {
        let bytes = (g * (1u64 << 30) as f64) as usize;
        if !(g > 0.0 && g.is_finite()) || bytes < model.stream_bytes(1, ask.verify_rows) {
            bail!("--memory-gib {g} leaves no room for one stream of this model: every request would be refused");
        }
        return Ok(Budget { bytes, how: format!("{g} GiB (--memory-gib)") });
    }
    let Some(free) = model.backend.memory_free() else {
        let bytes = (ask.host_gib * (1u64 << 30) as f64) as usize;
        return Ok(Budget { bytes, how: format!("{} GiB (the host's default; --memory-gib sets it)", ask.host_gib) });
    };
    // Decode rows are never cut to the budget, and at least one prompt row joins them (`scheduler::plan`).
    let rows = ask.round_rows.max(ask.parallel).saturating_add(1);
    let draft = model.drafter.as_ref().map_or(0, |d| model.round_bytes(ask.parallel.saturating_mul(d.cfg.block)));
    on_device(free, ask, model.round_bytes(rows).saturating_add(draft), model.stream_bytes(1, ask.verify_rows))
}

/// The device's budget from its `free` bytes: `DEVICE_SHARE` of them less the prompt cache and `round` bytes of
/// activations; an error when that leaves less than `one_stream` bytes.
fn on_device(free: usize, ask: &BudgetAsk, round: usize, one_stream: usize) -> anyhow::Result<Budget> {
    let gib = |b: usize| b as f64 / (1u64 << 30) as f64;
    let share = (free as f64 * DEVICE_SHARE) as usize;
    let bytes = share.saturating_sub(ask.prompt_cache_bytes).saturating_sub(round);
    if bytes < one_stream {
        bail!(
            "no device memory is left for streams: {:.2} GiB free after the weights, {:.2} GiB of it for the prompt \
             cache and {:.2} GiB for a round's activations; make the prompt cache or the rounds smaller, or set \
             --memory-gib",
            gib(free),
            gib(ask.prompt_cache_bytes),
            gib(round)
        );
    }
    let how = format!(
        "{:.2} GiB: {DEVICE_SHARE} of the {:.2} GiB free on the device after the weights, less {:.2} GiB of prompt \
         cache and {:.2} GiB for a round's activations (--memory-gib sets it)",
        gib(bytes),
        gib(free),
        gib(ask.prompt_cache_bytes),
        gib(round)
    );
    Ok(Budget { bytes, how })
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: usize = 1 << 30;

    fn ask(gib: Option<f64>) -> BudgetAsk {
        BudgetAsk { gib, host_gib: 8.0, prompt_cache_bytes: GIB, round_rows: 1280, parallel: 1024, verify_rows: 9 }
    }

    #[test]
    fn a_device_gives_its_share_of_the_free_memory_less_the_cache_and_a_round() {
        let b = on_device(100 * GIB, &ask(None), 2 * GIB, 1 << 20).expect("fits");
        assert_eq!(b.bytes, 87 * GIB);
        assert!(b.how.starts_with("87.00 GiB: 0.9 of the 100.00 GiB free"), "{}", b.how);
    }

    #[test]
    fn a_device_without_room_for_one_stream_is_refused_by_name() {
        let e = on_device(GIB, &ask(None), GIB / 2, 1 << 20).err().expect("refused").to_string();
        assert!(e.contains("no device memory is left for streams") && e.contains("--memory-gib"), "{e}");
    }

    #[test]
    fn a_given_budget_wins_and_a_bad_one_is_refused() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/lfm2-moe-f32");
        let src = tensorfold_model::Source::Dir(dir);
        let m = tensorfold_model::open(&src, tensorfold_kernels::CpuBackend).expect("the fixture opens").model;
        assert_eq!(stream_budget(&m, &ask(Some(2.5))).expect("given").bytes, 5 * GIB / 2);
        assert_eq!(stream_budget(&m, &ask(None)).expect("host").bytes, 8 * GIB, "the CPU has no free-memory query");
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY, 1e-12] {
            assert!(stream_budget(&m, &ask(Some(bad))).is_err(), "{bad} refused");
        }
    }
}
