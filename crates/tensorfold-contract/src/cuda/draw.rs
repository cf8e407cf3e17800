//! CUDA contract entry of the keyed draw (sample.cu): the host's `sample::draw` as reference, row invariance, edges.

use super::{Planted, device_gate, limits, rd, up, with_fault};
use crate::cases::*;
use crate::{Claim, Gate, Kernel, Scale};
use rand::{Rng, rngs::StdRng};
use tensorfold_kernels::backend::{DRAWN_GREEDY, drawn_words};
use tensorfold_kernels::cuda::{CudaBackend, Src};
use tensorfold_kernels::prelude::*;
use tensorfold_kernels::sample::{DrawSpec, SampleError, SamplingParams, draw, greedy_pick};

pub fn kernels(be: &CudaBackend) -> Vec<Box<dyn crate::Entry>> {
    vec![Box::new(Draw(be.clone()))]
}

struct Draw(CudaBackend);

pub(super) const DRAW_PLANTS: &[Planted<DrawFault>] = &[
    (DrawFault::NoiseOneLog, Src::Sample, "FAULT_DRAW_NOISE_ONE_LOG"),
    (DrawFault::NucleusShort, Src::Sample, "FAULT_DRAW_NUCLEUS_SHORT"),
    (DrawFault::WrongPosition, Src::Sample, "FAULT_DRAW_WRONG_POSITION"),
    (DrawFault::TopKOff, Src::Sample, "FAULT_DRAW_TOPK_OFF"),
    (DrawFault::AllToHost, Src::Sample, "FAULT_DRAW_ALL_HOST"),
];

/// The parameter sets every vocabulary is drawn under (seeds and positions vary by row).
fn cases(vocab: usize) -> Vec<SamplingParams> {
    let s = |temperature, top_k, top_p, min_p| SamplingParams { temperature, top_k, top_p, min_p, seed: 0 };
    vec![
        s(0.0, 0, 1.0, 0.0),
        s(1.0, 0, 1.0, 0.0),
        s(0.7, 0, 1.0, 0.0),
        s(1.0, 1, 1.0, 0.0),
        s(0.8, 20, 1.0, 0.0),
        s(1.0, vocab * 7 / 10, 1.0, 0.0),
        s(1.0, 0, 0.9, 0.0),
        s(1.0, 50, 0.5, 0.0),
        s(1.0, 0, 1.0, 0.05),
        s(0.3, 50, 0.8, 0.1),
        s(1.5, 0, 0.999, 0.0),
    ]
}

/// A row of flat logits (`uniform * 3`) or, for odd `r`, a peaked one (`40 x^7`): a few large logits, so a
/// top-p nucleus stays inside the device's window even at a served vocabulary.
fn row(rng: &mut StdRng, v: usize, r: usize) -> Vec<f32> {
    uniform(rng, v).into_iter().map(|x| if r.is_multiple_of(2) { 3.0 * x } else { 40.0 * x.powi(7) }).collect()
}

faults! {
    /// The planted controls of `cuda.draw`.
    enum DrawFault {
        NoiseOneLog = ("noise-one-log", "the Gumbel noise is -log(u), one log short"),
        NucleusShort = ("nucleus-short", "the top-p nucleus loses its last token"),
        WrongPosition = ("wrong-position", "the draw is keyed one position late"),
        TopKOff = ("top-k-off", "top-k is ignored when top-p is off"),
        AllToHost = ("all-to-host", "every top-p row is handed back to the host"),
    }
}

impl Kernel for Draw {
    fn name(&self) -> &'static str {
        "cuda.draw"
    }
    fn backend(&self) -> &'static str {
        "cuda"
    }
    fn claim(&self) -> Claim {
        Claim::BitEqual(
            "sample.rs draw: the same token id on every row (exp and log come from libdevice, so a pick could differ \
             only where two Gumbel scores or a nucleus boundary lie within an ulp of each other)",
        )
    }
    fn reference(&self) -> &'static str {
        "sample::draw (host keyed sampler)"
    }
    fn shapes(&self, scale: Scale) -> Vec<String> {
        let v = if scale == Scale::Served { "65536 and 128000" } else { "1000 and 3000" };
        vec![format!("{v} logits a row, 11 parameter sets x 4 rows")]
    }
    type Fault = DrawFault;
    fn gates(&self, scale: Scale, fault: Option<Self::Fault>, rng: &mut StdRng) -> Vec<Gate> {
        let be = with_fault(&self.0, DRAW_PLANTS, fault);
        let vocabs: &[usize] = if scale == Scale::Served { &[65_536, 128_000] } else { &[1000, 3000] };
        let mut gates = Vec::new();
        for &v in vocabs {
            let mut rows = Vec::new();
            let mut specs = Vec::new();
            for p in cases(v) {
                for r in 0..4 {
                    rows.push(row(rng, v, r));
                    let params = SamplingParams { seed: rng.random(), ..p };
                    specs.push(DrawSpec { params, position: rng.random_range(0..100_000) });
                }
            }
            let flat: Vec<f32> = rows.concat();
            let want: Vec<Result<u32, SampleError>> =
                rows.iter().zip(&specs).map(|(r, s)| draw(&s.params, s.position, r)).collect();
            let got = be.draw_rows_counted(&up(&be, &flat), v, &specs);
            let (got, on_host) =
                got.unwrap_or_else(|e| (vec![Err(SampleError::Device(e.to_string())); specs.len()], 0));
            let wrong = got.iter().zip(&want).filter(|(g, w)| g != w).count();
            let detail = format!("{v} logits: {} rows, {wrong} differ; {on_host} nuclei drawn by the host", rows.len());
            gates.push(Gate::new("reference", wrong == 0, detail));
            // Only a flat row's unbounded nucleus may outgrow the window: every other row draws on the device.
            let may = (0..rows.len()).filter(|&i| long_nucleus(&specs[i].params, i % 4, v)).count();
            gates.push(Gate::new(
                "window",
                on_host <= may,
                format!("{v} logits: {on_host} on the host, at most {may}"),
            ));
            gates.push(kept_on_device(&be, &flat, &rows, &specs, v));
            let single: usize = (0..rows.len())
                .filter(|&i| {
                    be.draw_rows_counted(&up(&be, &rows[i]), v, &specs[i..=i]).map(|d| d.0) != Ok(vec![got[i].clone()])
                })
                .count();
            gates.push(invariance_gate(&format!("{v} logits, each row alone against the batch"), single));
        }
        gates.push(edges(&be));
        gates.push(device_gate(&be));
        merge(gates)
    }
    fn limits(&self) -> Vec<String> {
        limits(&self.0, Src::Sample, &["draw_rows"])
    }
}

/// Whether a row (`r` = its index among its case's 4: even = flat) may have a nucleus longer than the device's
/// 2048-key window: a flat row, or top-p above 0.99 (a peaked row at T = 1.5 and 128000 logits needs about 2900
/// keys for 0.999), with top-p on and no top-k of at most 2048, in a vocabulary wider than the window.
fn long_nucleus(p: &SamplingParams, r: usize, v: usize) -> bool {
    (r.is_multiple_of(2) || p.top_p > 0.99)
        && p.temperature > 0.0
        && p.top_p < 1.0
        && (p.top_k == 0 || p.top_k > 2048)
        && v > 2048
}

/// Gate `kept`: `draw_into`'s words (left on the device) are the host's `drawn_words` of each row (plus a non-finite
/// row and a refused spec), or, for a nucleus past the window, the greedy pick with status DRAWN_GREEDY.
fn kept_on_device(be: &CudaBackend, flat: &[f32], rows: &[Vec<f32>], specs: &[DrawSpec], v: usize) -> Gate {
    // Two more rows: a non-finite logit under a sampled spec, and a refused spec (drawn as the greedy pick).
    let (mut rows, mut specs, mut flat) = (rows.to_vec(), specs.to_vec(), flat.to_vec());
    let mut bad = rows[1].clone();
    bad[v / 2] = f32::NAN;
    let refused = SamplingParams { temperature: 1.0, top_p: 0.0, ..SamplingParams::greedy() };
    for (r, params) in [(bad, specs[5].params), (rows[2].clone(), refused)] {
        flat.extend_from_slice(&r);
        rows.push(r);
        specs.push(DrawSpec { params, position: 17 });
    }
    let mut out = be.zeros(3 * specs.len());
    be.draw_into(&up(be, &flat), v, &specs, &mut out);
    let words: Vec<u32> = rd(be, &out).iter().map(|x| x.to_bits()).collect();
    let n = specs.len() - 2;
    let wrong = (0..specs.len())
        .filter(|&i| {
            let got = &words[3 * i..3 * i + 3];
            match got[1] {
                DRAWN_GREEDY => {
                    Ok(got[0]) != greedy_pick(&rows[i]) || i >= n || !long_nucleus(&specs[i].params, i % 4, v)
                }
                _ => got != drawn_words(&rows[i], &specs[i]),
            }
        })
        .count();
    Gate::new("kept", wrong == 0, format!("{v} logits: {wrong} of {} rows' device words differ", specs.len()))
}

/// Non-finite logits (the first index named), refused parameters, exact ties at the top-k bound, signed zeros, a
/// one-token vocabulary, and a two-token nucleus drawn at 32 positions: each against the host's draw.
fn edges(be: &CudaBackend) -> Gate {
    let t1 = SamplingParams { temperature: 1.0, seed: 7, ..SamplingParams::greedy() };
    let with = |n: usize, base: f32, set: &[(usize, f32)]| {
        let mut r = vec![base; n];
        set.iter().for_each(|&(i, x)| r[i] = x);
        r
    };
    let same = |row: &[f32], p: SamplingParams, position: u64| {
        let spec = DrawSpec { params: p, position };
        be.draw_rows_counted(&up(be, row), row.len(), &[spec]).map(|d| d.0) == Ok(vec![draw(&p, position, row)])
    };
    let nan = with(300, 1.0, &[(200, f32::NAN), (37, f32::NEG_INFINITY)]);
    let ties = with(100, 2.0, &[(90, 3.0)]);
    let zeros: Vec<f32> = (0..64).map(|i| if i % 2 == 0 { -0.0 } else { 0.0 }).collect();
    let pair = with(3000, -10.0, &[(1500, 5.0), (2999, 5.0 - 1e-3)]);
    let cases = [
        (same(&nan, t1, 3), "first non-finite index named"),
        (same(&nan, SamplingParams::greedy(), 3), "greedy flags non-finite"),
        (same(&ties, SamplingParams { temperature: -1.0, ..t1 }, 0), "refused temperature"),
        (same(&ties, SamplingParams { top_p: 0.0, ..t1 }, 0), "refused top_p"),
        ((0..16).all(|pos| same(&ties, SamplingParams { top_k: 10, ..t1 }, pos)), "ties at the top-k bound"),
        ((0..16).all(|pos| same(&ties, SamplingParams { top_k: 10, top_p: 0.5, ..t1 }, pos)), "ties in a nucleus"),
        ((0..16).all(|pos| same(&zeros, SamplingParams { top_k: 5, ..t1 }, pos)), "signed zeros"),
        (same(&[0.5], t1, 9), "one-token vocabulary"),
        ((0..32).all(|pos| same(&pair, SamplingParams { top_p: 0.6, ..t1 }, pos)), "two-token nucleus"),
    ];
    let failed: Vec<&str> = cases.iter().filter(|c| !c.0).map(|c| c.1).collect();
    let detail = if failed.is_empty() {
        "non-finite, refused parameters, top-k ties, signed zeros, one token, two-token nucleus".to_string()
    } else {
        format!("failed: {}", failed.join(", "))
    };
    Gate::new("edges", failed.is_empty(), detail)
}
