//! Gate bodies both suites run where the CPU and CUDA cases are the same: one body over a call closure (host values
//! in, host values out), which each suite's entry binds to its backend (and to its planted fault), adding the gates
//! only its backend has (CUDA: the fused forms and the `device` gate).

use crate::cases::*;
use crate::{Gate, Scale, WIDTHS};
use rand::rngs::StdRng;
use tensorfold_kernels::backend::Pick;

/// The RMSNorm epsilon the gates run at.
pub const RMS_EPS: f32 = 1e-5;

/// `call(x, weight, width)`: row-wise RMSNorm of `x` `[rows, width]` at [`RMS_EPS`], read back.
pub type RmsCall<'a> = &'a dyn Fn(&[f32], &[f32], usize) -> Vec<f32>;

/// RMSNorm's `reference` (2e-6 of the row's largest output) and `invariance` gates at widths 2048, 64, 6144 and 33,
/// and `edges` (a zero row normalizes to zeros), unmerged.
pub fn rmsnorm_gates(rng: &mut StdRng, call: RmsCall) -> Vec<Gate> {
    let mut gates = Vec::new();
    for width in [2048, 64, 6144, 33] {
        let w: Vec<f32> = uniform(rng, width).iter().map(|v| 1.0 + 0.2 * v).collect();
        let x = uniform(rng, 33 * width);
        let out = call(&x, &w, width);
        let mut err = 0f64;
        for r in 0..33 {
            let xr = wide(&x[r * width..(r + 1) * width]);
            let s = 1.0 / (dot64(&xr, &xr) / width as f64 + RMS_EPS as f64).sqrt();
            let want: Vec<f64> = xr.iter().zip(&w).map(|(v, w)| v * s * *w as f64).collect();
            err = err.max(max_err(&out[r * width..(r + 1) * width], &want, max_abs(&want)));
        }
        gates.push(reference_gate(&format!("width {width}"), err, 2e-6));
        let one: Vec<Vec<f32>> = (0..33).map(|r| call(&x[r * width..(r + 1) * width], &w, width)).collect();
        let mut inv = 0;
        for wd in WIDTHS {
            let o = call(&x[..wd * width], &w, width);
            inv += (0..wd).map(|r| bit_diffs(&o[r * width..(r + 1) * width], &one[r])).sum::<usize>();
        }
        gates.push(invariance_gate(&format!("width {width}"), inv));
    }
    let zero = call(&[0.0; 64], &[1.0; 64], 64);
    gates.push(Gate::new("edges", zero.iter().all(|v| *v == 0.0), "a zero row normalizes to zeros (finite)"));
    gates
}

/// `pick(logits, vocab)`: the greedy pick of each row of `logits` `[rows, vocab]`.
pub type PickCall<'a> = &'a dyn Fn(&[f32], usize) -> Vec<Pick>;

/// The greedy pick's `reference` (the exact scan) and `invariance` gates over 33 random rows of each vocabulary, and
/// `edges` (ties, ties across threads, NaN, +inf, -inf, all equal, all -inf), unmerged.
pub fn greedy_gates(scale: Scale, rng: &mut StdRng, pick: PickCall) -> Vec<Gate> {
    let vocabs: &[usize] = if scale == Scale::Served { &[128_000, 65_536] } else { &[1000] };
    let mut gates = Vec::new();
    for &v in vocabs {
        let rows: Vec<Vec<f32>> = (0..33).map(|_| uniform(rng, v)).collect();
        let flat: Vec<f32> = rows.concat();
        let got = pick(&flat, v);
        let wrong = rows
            .iter()
            .enumerate()
            .filter(|(i, r)| {
                let best = (0..v).fold(0, |b, j| if r[j] > r[b] { j } else { b });
                got.get(*i).is_none_or(|p| p.token as usize != best || p.nonfinite)
            })
            .count();
        gates.push(Gate::new("reference", wrong == 0, format!("{v} logits: 33 random rows, {wrong} wrong")));
        let one: Vec<Pick> =
            rows.iter().map(|r| pick(r, v).first().copied().unwrap_or(Pick { token: 0, nonfinite: true })).collect();
        let inv: usize =
            WIDTHS.iter().map(|&w| pick(&flat[..w * v], v).iter().zip(&one).filter(|(a, b)| a != b).count()).sum();
        gates.push(invariance_gate(&format!("{v} logits"), inv));
    }
    gates.push(greedy_edges(pick));
    gates
}

/// The greedy pick's edge cases, each a row of its own.
fn greedy_edges(pick: PickCall) -> Gate {
    let one = |row: &[f32]| pick(row, row.len()).first().copied().unwrap_or(Pick { token: u32::MAX, nonfinite: false });
    let with = |n: usize, base: f32, set: &[(usize, f32)]| {
        let mut r = vec![base; n];
        set.iter().for_each(|&(i, v)| r[i] = v);
        r
    };
    let cases = [
        (one(&with(16, 0.0, &[(3, 5.0), (9, 5.0)])) == Pick { token: 3, nonfinite: false }, "tie goes to the lower id"),
        (
            one(&with(1000, 0.0, &[(700, 5.0), (3, 5.0)])) == Pick { token: 3, nonfinite: false },
            "tie across threads goes to the lower id",
        ),
        (one(&with(16, 1.0, &[(5, f32::NAN)])).nonfinite, "NaN flags the row"),
        (one(&with(16, 1.0, &[(2, f32::INFINITY)])).nonfinite, "+inf flags the row"),
        (one(&with(16, 1.0, &[(0, f32::NEG_INFINITY)])).nonfinite, "-inf flags the row"),
        (one(&[2.0; 16]).token == 0, "all equal picks id 0"),
        (one(&[f32::NEG_INFINITY; 300]) == Pick { token: 0, nonfinite: true }, "all -inf: id 0, flagged"),
    ];
    let failed: Vec<&str> = cases.iter().filter(|c| !c.0).map(|c| c.1).collect();
    let detail = if failed.is_empty() {
        "ties, NaN, +inf, -inf, all equal, all -inf".to_string()
    } else {
        format!("failed: {}", failed.join(", "))
    };
    Gate::new("edges", failed.is_empty(), detail)
}
