//! Contract entry of the CPU's MLX affine forms (`cpu.affine`): 4- and 8-bit codes in mlx-lm's uint32 words with
//! f32 scales and biases, through the real linear, embedding (gather and head) and MoE expert kernels, against a
//! float64 reference that decodes the words itself.

use crate::cases::*;
use crate::{Claim, Gate, Kernel, Scale, WIDTHS};
use rand::{Rng, rngs::StdRng};
use tensorfold_kernels::backend::Ffn;
use tensorfold_kernels::bytes::{Affine, Dtype, HostBytes, MatView};
use tensorfold_kernels::cpu::{moe, ops};
use tensorfold_kernels::simd::{self, Level};

pub(crate) struct Affine4And8;
faults! {
    /// The planted controls of `cpu.affine`.
    enum AffineFault {
        NibbleSwap = ("nibble-swap", "4-bit codes are read high nibble first (8-bit: the bytes of a word reversed)"),
        NeighbourGroupScale = ("neighbour-group-scale", "each group takes the next group's scale"),
        UnfusedSimd = ("unfused-simd", "the SIMD levels round q*scale before adding the bias (two roundings a weight)"),
    }
}

/// An MLX affine matrix as mlx-lm writes it: random uint32 words (`bits` a code, first code in the low bits), and
/// per-group scales and biases rounded to bf16 (as released) and held as f32.
struct Mlx {
    rows: usize,
    cols: usize,
    bits: u32,
    group: usize,
    words: Vec<u32>,
    scales: Vec<f32>,
    biases: Vec<f32>,
}

impl Mlx {
    fn random(rng: &mut StdRng, rows: usize, cols: usize, bits: u32, group: usize) -> Self {
        let bf16 = |v: f32| f32::from_bits(v.to_bits() & 0xffff_0000);
        let words = (0..rows * cols * bits as usize / 32).map(|_| rng.random::<u32>()).collect();
        let g = rows * cols / group;
        let scales = (0..g).map(|_| bf16(rng.random::<f32>() * 0.02 / bits as f32)).collect();
        let biases = (0..g).map(|_| bf16(-rng.random::<f32>() * 0.1)).collect();
        Self { rows, cols, bits, group, words, scales, biases }
    }

    /// Code `c` of row `r`, decoded from the words as MLX packs them (the reference's own decoding).
    fn code(&self, r: usize, c: usize) -> u32 {
        let per = 32 / self.bits as usize;
        let i = r * self.cols + c;
        (self.words[i / per] >> (self.bits as usize * (i % per))) & ((1 << self.bits) - 1)
    }

    /// Weight `(r, c)` in float64: `code * scale + bias`, unrounded.
    fn w64(&self, r: usize, c: usize) -> f64 {
        let g = (r * self.cols + c) / self.group;
        self.code(r, c) as f64 * self.scales[g] as f64 + self.biases[g] as f64
    }

    /// The kernels' view, zero-copy over the words' little-endian bytes as the loader makes it, with `fault`.
    fn view(&self, fault: Option<AffineFault>) -> MatView {
        let mut bytes: Vec<u8> = self.words.iter().flat_map(|w| w.to_le_bytes()).collect();
        let mut scales = self.scales.clone();
        match fault {
            Some(AffineFault::NibbleSwap) if self.bits == 4 => bytes.iter_mut().for_each(|b| *b = b.rotate_left(4)),
            Some(AffineFault::NibbleSwap) => bytes.chunks_mut(4).for_each(|c| c.reverse()),
            Some(AffineFault::NeighbourGroupScale) => scales.rotate_left(1),
            Some(AffineFault::UnfusedSimd) | None => {}
        }
        let dtype = if self.bits == 4 { Dtype::Q4 } else { Dtype::Q8 };
        let affine = Affine {
            group: self.group,
            scales: HostBytes::from_f32(&scales),
            biases: HostBytes::from_f32(&self.biases),
        };
        MatView::quantized(self.rows, self.cols, dtype, HostBytes::copy_from(&bytes), affine).expect("consistent")
    }
}

/// `(rows, cols, bits, group)` of the linear and head cases.
fn shapes(scale: Scale) -> Vec<(usize, usize, u32, usize)> {
    let mut v = vec![(40, 64, 4, 32), (24, 128, 8, 64), (32, 256, 4, 128), (16, 96, 8, 32), (300, 64, 4, 64)];
    if scale == Scale::Served {
        v.extend([(2048, 2048, 4, 64), (6144, 2048, 4, 64), (2048, 1536, 4, 64), (64, 2048, 8, 64)]);
        v.extend([(128_000, 2048, 4, 64), (2048, 2048, 8, 64)]);
    }
    v
}

/// Reference error of a linear over `x` `[rows, k]` in units of the bound `(k/16 + 6) * 2^-24 * sum|x w|`: the
/// canonical dot's bound plus one rounding of each `fma(q, scale, bias)` weight.
fn linear_err(m: &Mlx, x: &[f32], rows: usize, out: &[f32]) -> f64 {
    let k = m.cols;
    let mut err = 0f64;
    for r in 0..rows {
        for j in 0..m.rows {
            let (mut dot, mut abs) = (0f64, 0f64);
            for c in 0..k {
                let p = x[r * k + c] as f64 * m.w64(j, c);
                dot += p;
                abs += p.abs();
            }
            err = err.max((out[r * m.rows + j] as f64 - dot).abs() / (dot_bound(k, abs) + f64::powi(2.0, -24) * abs));
        }
    }
    err
}

/// A linear-like call: `(x [rows, k], rows, out [rows, n])`.
type RowsCall<'a> = &'a dyn Fn(&[f32], usize, &mut [f32]);

/// Outputs that differ between wide calls and one-row calls of `f` over `x` `[33, k]`, at every width.
fn widths_diffs(f: RowsCall, x: &[f32], k: usize, n: usize) -> usize {
    let mut one = vec![0f32; 33 * n];
    for r in 0..33 {
        f(&x[r * k..(r + 1) * k], 1, &mut one[r * n..(r + 1) * n]);
    }
    WIDTHS
        .iter()
        .map(|&w| {
            let mut o = vec![0f32; w * n];
            f(&x[..w * k], w, &mut o);
            bit_diffs(&o, &one[..w * n])
        })
        .sum()
}

impl Kernel for Affine4And8 {
    fn name(&self) -> &'static str {
        "cpu.affine"
    }
    fn claim(&self) -> Claim {
        Claim::Bound(
            "(k/16+6)*2^-24*sum|x*w| of float64 per output: each weight is fma(q, scale, bias) in f32 (one rounding), \
             then the canonical 16-lane dot; embedding rows bit-equal to fma(q, scale, bias)",
        )
    }
    fn reference(&self) -> &'static str {
        "float64 q*scale+bias with q decoded from mlx-lm's uint32 words (first code in the low bits); float64 \
         SwiGLU experts over those weights"
    }
    fn shapes(&self, scale: Scale) -> Vec<String> {
        let mut v: Vec<String> = shapes(scale).iter().map(|(n, k, b, g)| format!("[{n},{k}] {b}-bit g{g}")).collect();
        v.push("experts: hidden 64, 4 experts of 32, 4- and 8-bit g32".into());
        v
    }
    type Fault = AffineFault;
    fn gates(&self, scale: Scale, fault: Option<Self::Fault>, rng: &mut StdRng) -> Vec<Gate> {
        let mut gates = Vec::new();
        for (n, k, bits, group) in shapes(scale) {
            let m = Mlx::random(rng, n, k, bits, group);
            let w = m.view(fault);
            let shape = format!("[{n},{k}] {bits}-bit g{group}");
            let x = uniform(rng, 2 * k);
            let mut out = vec![0f32; 2 * n];
            ops::linear(&x, 2, &w, None, &mut out);
            gates.push(reference_gate(&shape, linear_err(&m, &x, 2, &out), 1.0));
            let wn = w.row_range(0, n.min(2048)).expect("prefix");
            let xs = uniform(rng, 33 * k);
            let diffs = widths_diffs(&|x, r, o| ops::linear(x, r, &wn, None, o), &xs, k, wn.rows);
            gates.push(invariance_gate(&shape, diffs));
            // Scales off the bf16 grid (as f32 checkpoints hold them), so `q * scale` rounds and a path that did not
            // fuse the weight's multiply-add would show.
            let mut mf = Mlx::random(rng, n.min(256), k, bits, group);
            mf.scales.iter_mut().for_each(|s| *s *= 1.0 + rng.random::<f32>() * 1e-2);
            gates.push(paths_gate(&shape, &mf.view(fault), &xs, fault));
            // The embedding's rows (the tied table's gather): each value exactly f32(fma(q, scale, bias)).
            let ids: Vec<u32> = (0..8).map(|_| rng.random_range(0..n as u32)).collect();
            let mut rows = vec![0f32; 8 * k];
            let ok = ops::embed(&w, &ids, &mut rows).is_ok();
            let want: Vec<f32> = ids
                .iter()
                .flat_map(|&i| (0..k).map(move |c| (i as usize, c)))
                .map(|(r, c)| {
                    let g = (r * k + c) / group;
                    (m.code(r, c) as f32).mul_add(m.scales[g], m.biases[g])
                })
                .collect();
            let refused = ops::embed(&w, &[n as u32], &mut rows[..k]).is_err();
            let d = bit_diffs(&rows, &want);
            gates.push(Gate::new("embed rows", ok && d == 0, format!("{shape}: {d} of {} values differ", want.len())));
            gates.push(Gate::new("edges", refused, format!("{shape}: id {n} past the table refused = {refused}")));
        }
        gates.extend(expert_gates(fault, rng));
        merge(gates)
    }
}

/// Rows of the `paths` gate's calls: one (decode, codes widened in registers), 5 (a 4-row register block and one
/// row) and 16 (column blocks widened once for the rows).
const PATH_ROWS: [usize; 3] = [1, 5, 16];

/// The linear on every SIMD level this CPU has, against the portable path, bit for bit, over `x` `[33, k]`.
/// Under `UnfusedSimd` the SIMD levels run on weights rounded twice (`q * scale`, then `+ bias`).
fn paths_gate(shape: &str, w: &MatView, x: &[f32], fault: Option<AffineFault>) -> Gate {
    let k = w.cols;
    let unfused = (fault == Some(AffineFault::UnfusedSimd)).then(|| unfused_copy(w));
    let mut diffs = 0;
    for rows in PATH_ROWS {
        let mut want = vec![0f32; rows * w.rows];
        ops::linear_on(Level::Portable, &x[..rows * k], rows, w, None, &mut want);
        for lv in simd::available_levels().into_iter().filter(|&l| l != Level::Portable) {
            let mut got = vec![0f32; rows * w.rows];
            ops::linear_on(lv, &x[..rows * k], rows, unfused.as_ref().unwrap_or(w), None, &mut got);
            diffs += bit_diffs(&got, &want);
        }
    }
    let levels = simd::available_levels().len();
    Gate::new("paths", diffs == 0, format!("{shape}: {diffs} outputs of {levels} levels differ from the portable path"))
}

/// `w` as f32 weights each rounded twice: `(q * scale) + bias` (the `unfused-simd` control).
fn unfused_copy(w: &MatView) -> MatView {
    let a = w.affine.as_ref().expect("affine");
    let f32_at = |h: &HostBytes, i: usize| f32::from_le_bytes(h.as_slice()[4 * i..4 * i + 4].try_into().expect("4"));
    let codes = w.bytes.as_slice();
    let v: Vec<f32> = (0..w.rows * w.cols)
        .map(|i| {
            let q = if w.dtype == Dtype::Q4 { (codes[i / 2] >> (4 * (i % 2))) & 15 } else { codes[i] };
            let g = i / a.group;
            q as f32 * f32_at(&a.scales, g) + f32_at(&a.biases, g)
        })
        .collect();
    MatView::from_f32(w.rows, w.cols, &v)
}

/// The MoE experts' kernel over quantized gate, up and down projections: the float64 SwiGLU of every assignment,
/// and invariance over widths.
fn expert_gates(fault: Option<AffineFault>, rng: &mut StdRng) -> Vec<Gate> {
    let (h, inter, ne, k) = (64, 32, 4, 2);
    let mut gates = Vec::new();
    for bits in [4, 8] {
        let raw: Vec<[Mlx; 3]> = (0..ne)
            .map(|_| {
                [
                    Mlx::random(rng, inter, h, bits, 32),
                    Mlx::random(rng, inter, h, bits, 32),
                    Mlx::random(rng, h, inter, bits, 32),
                ]
            })
            .collect();
        let ex: Vec<Ffn<MatView>> =
            raw.iter().map(|[a, b, c]| Ffn { w1: a.view(fault), w3: b.view(fault), w2: c.view(fault) }).collect();
        let rows = 33;
        let x = uniform(rng, rows * h);
        let sel: Vec<f32> = (0..rows * k).map(|a| ((a * 3 + a / k) % ne) as f32).collect();
        let mut y = vec![0f32; rows * k * h];
        moe::experts(&x, rows, &sel, k, &ex, 0, &mut y);
        let mut err = 0f64;
        for a in 0..rows * k {
            let [w1, w3, w2] = &raw[sel[a] as usize];
            let xr = &x[(a / k) * h..(a / k + 1) * h];
            let act: Vec<f64> = (0..inter)
                .map(|i| {
                    let g: f64 = (0..h).map(|c| xr[c] as f64 * w1.w64(i, c)).sum();
                    let u: f64 = (0..h).map(|c| xr[c] as f64 * w3.w64(i, c)).sum();
                    g / (1.0 + (-g).exp()) * u
                })
                .collect();
            let want: Vec<f64> = (0..h).map(|o| (0..inter).map(|i| act[i] * w2.w64(o, i)).sum()).collect();
            err = err.max(max_err(&y[a * h..(a + 1) * h], &want, max_abs(&want)));
        }
        gates.push(reference_gate(&format!("experts {bits}-bit"), err, 1e-5));
        let part = |w: usize| {
            let mut o = vec![0f32; w * k * h];
            moe::experts(&x[..w * h], w, &sel[..w * k], k, &ex, 0, &mut o);
            bit_diffs(&o, &y[..w * k * h])
        };
        gates.push(invariance_gate(&format!("experts {bits}-bit"), WIDTHS.iter().map(|&w| part(w)).sum()));
    }
    gates
}
