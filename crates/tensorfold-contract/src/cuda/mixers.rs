//! CUDA contract entries of the positional and stateful row kernels: q/k norm + RoPE at segment-table positions,
//! and the short conv over several streams' states (with the rollback window).

use super::{Planted, device_gate, limits, poisoned, rd, up, with_fault};
use crate::cases::*;
use crate::{Claim, Entry, Gate, Kernel, Scale, WIDTHS};
use rand::{Rng, rngs::StdRng};
use tensorfold_kernels::KernelError;
use tensorfold_kernels::backend::{RopeParams, Segment};
use tensorfold_kernels::cpu::{CpuConv, conv, ops};
use tensorfold_kernels::cuda::{CudaBackend, CudaBuf, CudaConv, Src};
use tensorfold_kernels::prelude::*;

pub fn kernels(be: &CudaBackend) -> Vec<Box<dyn Entry>> {
    vec![Box::new(QkRope(be.clone())), Box::new(ShortConv(be.clone()))]
}

/// Absolute position of each row of a segment table.
fn positions(segs: &[Segment]) -> Vec<(usize, usize)> {
    segs.iter().flat_map(|s| (0..s.rows).map(move |i| (s.first_row + i, s.start_pos + i))).collect()
}

struct QkRope(CudaBackend);

pub(super) const ROPE_PLANTS: &[Planted<QkRopeFault>] = &[
    (QkRopeFault::WrongPairs, Src::Rope, "FAULT_ROPE_PAIRS"),
    (QkRopeFault::PositionOffByOne, Src::Rope, "FAULT_ROPE_POS"),
    (QkRopeFault::PairSharesWeight, Src::Rope, "FAULT_ROPE_PAIR_NORM"),
];

faults! {
    /// The planted controls of `cuda.qk_norm_rope`.
    enum QkRopeFault {
        WrongPairs = ("wrong-pairs", "rotates the other pairing: (2i, 2i+1) for (i, i + hd/2) and back"),
        PositionOffByOne = ("position-off-by-one", "rotates by position + 1"),
        PairSharesWeight = (
            "pair-shares-weight",
            "the one-launch q and k form norms the key heads with the query weight",
        ),
    }
}

impl Kernel for QkRope {
    fn name(&self) -> &'static str {
        "cuda.qk_norm_rope"
    }
    fn backend(&self) -> &'static str {
        "cuda"
    }
    fn claim(&self) -> Claim {
        Claim::Bound(
            "4e-6 of the row's largest output (f32 per-head RMSNorm, then one f32 rotation by double-precision cos/sin)",
        )
    }
    fn reference(&self) -> &'static str {
        "float64 per-head RMSNorm then rotation of half-split or interleaved pairs by the f32 angle inv_freq * pos (as transformers computes it)"
    }
    fn shapes(&self, scale: Scale) -> Vec<String> {
        let h = if scale == Scale::Served { "32 heads x 64 and 8 heads x 64" } else { "4 heads x 16 and 3 heads x 40" };
        vec![format!("{h}; 4 streams, positions up to 127999, theta 1e6")]
    }
    type Fault = QkRopeFault;
    fn gates(&self, scale: Scale, fault: Option<Self::Fault>, rng: &mut StdRng) -> Vec<Gate> {
        let be = with_fault(&self.0, ROPE_PLANTS, fault);
        let heads_set: &[(usize, usize)] =
            if scale == Scale::Served { &[(32, 64), (8, 64)] } else { &[(4, 16), (3, 40)] };
        let mut gates = Vec::new();
        for (&(heads, hd), interleaved) in heads_set.iter().flat_map(|h| [(h, false), (h, true)]) {
            gates.extend(Self::one_shape(&be, rng, heads, RopeParams { theta: 1e6, head_dim: hd, interleaved }));
        }
        gates.push(device_gate(&be));
        merge(gates)
    }
    fn limits(&self) -> Vec<String> {
        limits(&self.0, Src::Rope, &["qk_norm_rope"])
    }
}

impl QkRope {
    fn one_shape(be: &CudaBackend, rng: &mut StdRng, heads: usize, rope: RopeParams) -> Vec<Gate> {
        let (hd, eps) = (rope.head_dim, 1e-5f32);
        let w = heads * hd;
        let pair = |i: usize| if rope.interleaved { (2 * i, 2 * i + 1) } else { (i, i + hd / 2) };
        let normh: Vec<f32> = uniform(rng, hd).iter().map(|v| 1.0 + 0.2 * v).collect();
        let norm = up(be, &normh);
        // Stream 2's rows end at position 127999 in the widest call; stream 1 starts at 0.
        let starts = [rng.random_range(0..100_000), 0, 127_991, rng.random_range(0..1000)];
        let x = uniform(rng, 33 * w);
        let call = |x: &[f32], segs: &[Segment]| -> Result<Vec<f32>, KernelError> {
            let mut b = up(be, x);
            be.qk_norm_rope(&mut b, heads, &norm, eps, rope, segs)?;
            Ok(rd(be, &b))
        };
        let segs = split(33, 4, &starts);
        let out = call(&x, &segs).unwrap_or_default();
        let mut err = if out.len() == x.len() { 0f64 } else { f64::INFINITY };
        for (r, p) in positions(&segs).into_iter().filter(|_| out.len() == x.len()) {
            for h in 0..heads {
                let at = (r * heads + h) * hd;
                let xs = wide(&x[at..at + hd]);
                let s = 1.0 / (dot64(&xs, &xs) / hd as f64 + eps as f64).sqrt();
                let n: Vec<f64> = xs.iter().zip(&normh).map(|(v, w)| v * s * *w as f64).collect();
                let mut want = vec![0f64; hd];
                for i in 0..hd / 2 {
                    let a = (ops::rope_inv_freq(1e6, hd, i) * p as f32) as f64;
                    let (ia, ib) = pair(i);
                    want[ia] = n[ia] * a.cos() - n[ib] * a.sin();
                    want[ib] = n[ib] * a.cos() + n[ia] * a.sin();
                }
                err = err.max(max_err(&out[at..at + hd], &want, max_abs(&want)));
            }
        }
        let style = if rope.interleaved { "interleaved" } else { "half-split" };
        let shape = format!("{heads}x{hd} {style}");
        let mut inv = 0;
        for n in WIDTHS {
            let segs = split(n, 4, &starts);
            let o = call(&x[..n * w], &segs).unwrap_or_default();
            for (r, p) in positions(&segs) {
                let one = call(&x[r * w..(r + 1) * w], &[Segment { first_row: 0, rows: 1, start_pos: p, cache: 0 }]);
                inv += one.map_or(w, |one| bit_diffs(o.get(r * w..(r + 1) * w).unwrap_or(&[]), &one));
            }
        }
        // Position 0 leaves each head exactly as the rmsnorm kernel normalizes it (width head_dim).
        let at0 = call(&x[..w], &[Segment { first_row: 0, rows: 1, start_pos: 0, cache: 0 }]).unwrap_or_default();
        let mut normed = poisoned(be, w);
        be.rmsnorm(&up(be, &x[..w]), &norm, eps, hd, &mut normed);
        let same = bit_diffs(&at0, &rd(be, &normed)) == 0;
        let uncovered = matches!(
            call(&x[..2 * w], &[Segment { first_row: 0, rows: 1, start_pos: 0, cache: 0 }]),
            Err(KernelError::Segments(_))
        );
        // q and k in one launch: each part bit-equal to its own call (k: fewer heads, its own weight).
        let kh = heads.div_ceil(3);
        let (xk, knorm) = (uniform(rng, 33 * kh * hd), uniform(rng, hd));
        let knorm = up(be, &knorm.iter().map(|v| 1.0 - 0.3 * v).collect::<Vec<_>>());
        let (mut pq, mut pk, mut sk) = (up(be, &x), up(be, &xk), up(be, &xk));
        let ok = be.qk_norm_rope_pair((&mut pq, heads, &norm), (&mut pk, kh, &knorm), eps, rope, &segs).is_ok()
            && be.qk_norm_rope(&mut sk, kh, &knorm, eps, rope, &segs).is_ok();
        let pair = bit_diffs(&rd(be, &pq), &out) + bit_diffs(&rd(be, &pk), &rd(be, &sk));
        vec![
            reference_gate(&shape, err, 4e-6),
            invariance_gate(&format!("{shape}, widths over 4 streams"), inv),
            Gate::new(
                "pair",
                ok && pair == 0,
                format!("q ({heads} heads) and k ({kh}) in one launch against their own calls: {pair} values differ"),
            ),
            Gate::new(
                "edges",
                same && uncovered,
                format!(
                    "position 0 equals the rmsnorm kernel's head: {same}; a row outside the segment table refused: {uncovered}; position 127999 in the reference set"
                ),
            ),
        ]
    }
}

struct ShortConv(CudaBackend);

pub(super) const CONV_PLANTS: &[Planted<ShortConvFault>] = &[
    (ShortConvFault::ReadsFirstStream, Src::Conv, "FAULT_CONV_FIRST_STREAM"),
    (ShortConvFault::StateNotAdvanced, Src::Conv, "FAULT_CONV_NO_ADVANCE"),
];

/// One short_conv call's fixed inputs.
struct ConvCase {
    width: usize,
    taps: usize,
    w: Vec<f32>,
    b: Vec<f32>,
    bcx: Vec<f32>,
    base: Vec<Vec<f32>>,
}

impl ConvCase {
    fn states(&self, be: &CudaBackend) -> Vec<CudaConv> {
        self.base.iter().map(|s| be.conv_from_host(self.width, self.taps, s).expect("conv state")).collect()
    }

    /// The CUDA kernel over `rows` rows of bcx starting at row `from`.
    fn call(
        &self,
        be: &CudaBackend,
        from: usize,
        segs: &[Segment],
        states: &mut [CudaConv],
    ) -> Result<Vec<f32>, KernelError> {
        let rows = segs.iter().map(|s| s.rows).sum::<usize>();
        let (w3, width) = (3 * self.width, self.width);
        let mut out: CudaBuf = poisoned(be, rows * width);
        let mut refs: Vec<&mut CudaConv> = states.iter_mut().collect();
        let (wb, bb) = (up(be, &self.w), up(be, &self.b));
        be.short_conv(
            &up(be, &self.bcx[from * w3..(from + rows) * w3]),
            width,
            &wb,
            Some(&bb),
            segs,
            &mut refs,
            &mut out,
        )?;
        Ok(rd(be, &out))
    }

    /// float64 outputs of the 8-row, 4-stream call, and each stream's advanced state in f32.
    fn reference(&self, segs: &[Segment]) -> (Vec<Vec<f64>>, Vec<Vec<f32>>) {
        let (width, hist) = (self.width, self.taps - 1);
        let bx =
            |r: usize, c: usize| self.bcx[r * 3 * width + c] as f64 * self.bcx[r * 3 * width + 2 * width + c] as f64;
        let (mut outs, mut states) = (vec![Vec::new(); 8], vec![Vec::new(); 4]);
        for s in segs {
            let mut all: Vec<Vec<f64>> =
                (0..hist).map(|i| wide(&self.base[s.cache][i * width..(i + 1) * width])).collect();
            all.extend((s.first_row..s.first_row + s.rows).map(|r| (0..width).map(|c| bx(r, c)).collect::<Vec<f64>>()));
            for t in 0..s.rows {
                let r = s.first_row + t;
                outs[r] = (0..width)
                    .map(|c| {
                        let acc: f64 = (0..self.taps).map(|i| self.w[c * self.taps + i] as f64 * all[t + i][c]).sum();
                        self.bcx[r * 3 * width + width + c] as f64 * (acc + self.b[c] as f64)
                    })
                    .collect();
            }
            states[s.cache] = all[all.len() - hist..].iter().flat_map(|v| v.iter().map(|x| *x as f32)).collect();
        }
        (outs, states)
    }

    /// The CPU kernel on the same call: outputs and new states.
    fn cpu(&self, segs: &[Segment]) -> (Vec<f32>, Vec<Vec<f32>>) {
        let mut st: Vec<CpuConv> =
            self.base.iter().map(|s| CpuConv { state: s.clone(), ..CpuConv::new(self.width, self.taps) }).collect();
        let mut refs: Vec<&mut CpuConv> = st.iter_mut().collect();
        let mut out = vec![0f32; 8 * self.width];
        let _ = conv::short_conv(
            &self.bcx[..24 * self.width],
            self.width,
            &self.w,
            Some(&self.b),
            segs,
            &mut refs,
            &mut out,
        );
        (out, st.into_iter().map(|c| c.state).collect())
    }
}

faults! {
    /// The planted controls of `cuda.short_conv`.
    enum ShortConvFault {
        ReadsFirstStream = ("reads-first-stream", "every stream reads the first stream's conv state"),
        StateNotAdvanced = ("state-not-advanced", "the conv state is left where it was after the call"),
        KeepAtWindowEnd = ("keep-at-window-end", "a rolled-back window leaves the state at the window's end"),
    }
}

impl Kernel for ShortConv {
    fn name(&self) -> &'static str {
        "cuda.short_conv"
    }
    fn backend(&self) -> &'static str {
        "cuda"
    }
    fn claim(&self) -> Claim {
        Claim::Bound(
            "1e-6 of the row's largest output; bit-equal to cpu.short_conv (the same f32 operations in the same order)",
        )
    }
    fn reference(&self) -> &'static str {
        "float64 C * (causal depthwise conv of B*x over the stream's state and rows + bias); the CPU kernel's bits"
    }
    fn shapes(&self, scale: Scale) -> Vec<String> {
        let w = if scale == Scale::Served { "width 2048 (6144-wide B,C,x input)" } else { "width 24" };
        vec![format!("{w}, 3 taps, 4 streams")]
    }
    type Fault = ShortConvFault;
    fn gates(&self, scale: Scale, fault: Option<Self::Fault>, rng: &mut StdRng) -> Vec<Gate> {
        let be = with_fault(&self.0, CONV_PLANTS, fault);
        let (width, taps) = (if scale == Scale::Served { 2048 } else { 24 }, 3);
        let hist = taps - 1;
        let case = ConvCase {
            width,
            taps,
            w: uniform(rng, width * taps),
            b: uniform(rng, width),
            bcx: uniform(rng, 33 * 3 * width),
            base: (0..4).map(|_| uniform(rng, hist * width)).collect(),
        };
        let starts = [7, 0, 3, 100];
        let segs = split(8, 4, &starts);
        let mut st = case.states(&be);
        let out = case.call(&be, 0, &segs, &mut st).unwrap_or_default();
        let (want, want_states) = case.reference(&segs);
        let err = if out.len() == 8 * width {
            want.iter()
                .enumerate()
                .map(|(r, w)| max_err(&out[r * width..(r + 1) * width], w, max_abs(w)))
                .fold(0.0, f64::max)
        } else {
            f64::INFINITY
        };
        let got_states: Vec<Vec<f32>> = st.iter().map(|c| be.conv_to_host(c).unwrap_or_default()).collect();
        let advanced = segs.iter().all(|s| bit_diffs(&got_states[s.cache], &want_states[s.cache]) == 0);
        let (cpu_out, cpu_states) = case.cpu(&segs);
        let cpu_diff =
            bit_diffs(&out, &cpu_out) + (0..4).map(|i| bit_diffs(&got_states[i], &cpu_states[i])).sum::<usize>();
        let mut gates = vec![
            reference_gate("8 rows over 4 streams", err, 1e-6),
            Gate::new("cpu", cpu_diff == 0, format!("{cpu_diff} output and state values differ from cpu.short_conv")),
            invariance_gate("widths over 4 streams, 33 rows over 2", Self::invariance(&self.0, &be, &case, &starts)),
        ];
        gates.push(Self::edges(&be, &case, fault, advanced));
        gates.push(device_gate(&be));
        gates
    }
    fn limits(&self) -> Vec<String> {
        limits(&self.0, Src::Conv, &["conv_out", "conv_window", "conv_state", "conv_fused"])
    }
}

impl ShortConv {
    /// Each row of calls of every width against a one-row call on its stream's state advanced (by the unplanted
    /// kernel on `base`) over the segment's earlier rows. The widths over 4 streams take the one-launch form
    /// (`conv_fused`, segments of at most 16 rows); 33 rows over 2 streams (17 and 16) take the three launches.
    fn invariance(base: &CudaBackend, be: &CudaBackend, case: &ConvCase, starts: &[usize]) -> usize {
        let width = case.width;
        let mut inv = 0;
        for (n, streams) in WIDTHS.iter().map(|&n| (n, 4)).chain([(33, 2)]) {
            let segs = split(n, streams, starts);
            let mut st = case.states(be);
            let Ok(o) = case.call(be, 0, &segs, &mut st) else {
                inv += 1;
                continue;
            };
            for s in &segs {
                for r in s.first_row..s.first_row + s.rows {
                    let mut solo = case.states(base);
                    if r > s.first_row {
                        let prep = [Segment { first_row: 0, rows: r - s.first_row, start_pos: 0, cache: s.cache }];
                        let _ = case.call(base, s.first_row, &prep, &mut solo);
                    }
                    let seg = [Segment { first_row: 0, rows: 1, start_pos: 0, cache: s.cache }];
                    let one = case.call(be, r, &seg, &mut solo).unwrap_or_default();
                    inv += bit_diffs(&o[r * width..(r + 1) * width], &one);
                }
            }
        }
        inv
    }

    /// A mismatched state is refused; states advanced; a 5-row window kept to 2 rows equals a 2-row call.
    fn edges(be: &CudaBackend, case: &ConvCase, fault: Option<ShortConvFault>, advanced: bool) -> Gate {
        let seg = |rows| [Segment { first_row: 0, rows, start_pos: 0, cache: 0 }];
        let mut wrong = [be.new_conv(case.width, case.taps + 1)];
        let refused = matches!(case.call(be, 0, &seg(1), &mut wrong), Err(KernelError::Shape { .. }));
        let (mut w5, mut w2) = (vec![case.states(be).swap_remove(0)], vec![case.states(be).swap_remove(0)]);
        let ran = case.call(be, 0, &seg(5), &mut w5).is_ok() && case.call(be, 0, &seg(2), &mut w2).is_ok();
        let kept = match fault {
            Some(ShortConvFault::KeepAtWindowEnd) => Ok(()),
            _ => be.conv_keep(&mut w5[0], 2),
        };
        let (s5, s2) = (be.conv_to_host(&w5[0]).unwrap_or_default(), be.conv_to_host(&w2[0]).unwrap_or_default());
        let rolled = ran && kept.is_ok() && !s5.is_empty() && bit_diffs(&s5, &s2) == 0;
        let too_far = be.conv_keep(&mut w5[0], 3).is_err();
        let reserved = reserved_window(be, case);
        Gate::new(
            "edges",
            refused && advanced && rolled && too_far && reserved,
            format!(
                "mismatched state refused: {refused}; states hold the last {} rows of B*x: {advanced}; a 5-row window \
                 kept to 2 rows equals a 2-row call: {rolled}; keeping past the kept rows refused: {too_far}; a state \
                 reserved for 2-row windows keeps none of a 5-row call, keeps a 2-row one, in the room reserved: \
                 {reserved}",
                case.taps - 1
            ),
        )
    }
}

/// A state reserved for verify windows of 2 rows (`conv_reserve`) holds the state and a window of `taps - 1 + 2` rows
/// from the start; a 5-row call keeps no window (rolling it back is refused), leaves the room as it was and the
/// state an unreserved 5-row call leaves; a 2-row call keeps its window in that room, and kept to 1 row equals a
/// 1-row call. A kept 1-row window regrown by a later reserve keeps nothing to roll back into.
fn reserved_window(be: &CudaBackend, case: &ConvCase) -> bool {
    let seg = |rows| [Segment { first_row: 0, rows, start_pos: 0, cache: 0 }];
    let host = |c: &CudaConv| be.conv_to_host(c).unwrap_or_default();
    let alone = |rows: usize| {
        let mut a = vec![case.states(be).swap_remove(0)];
        let ran = case.call(be, 0, &seg(rows), &mut a).is_ok();
        if ran { host(&a[0]) } else { Vec::new() }
    };
    let hist = case.taps - 1;
    let room = (2 * hist + 2) * case.width * 4;
    let mut r = vec![case.states(be).swap_remove(0)];
    let at_reserve = be.conv_reserve(&mut r[0], 2).is_ok() && be.conv_bytes(&r[0]) == room;
    let long = case.call(be, 0, &seg(5), &mut r).is_ok() && be.conv_keep(&mut r[0], 2).is_err();
    let (five, one) = (alone(5), alone(1));
    let long = long && be.conv_bytes(&r[0]) == room && !five.is_empty() && bit_diffs(&host(&r[0]), &five) == 0;
    let mut r = vec![case.states(be).swap_remove(0)];
    let short = be.conv_reserve(&mut r[0], 2).is_ok()
        && case.call(be, 0, &seg(2), &mut r).is_ok()
        && be.conv_keep(&mut r[0], 1).is_ok();
    let short = short && be.conv_bytes(&r[0]) == room && !one.is_empty() && bit_diffs(&host(&r[0]), &one) == 0;
    let mut g = vec![case.states(be).swap_remove(0)];
    let regrown = case.call(be, 0, &seg(1), &mut g).is_ok()
        && be.conv_reserve(&mut g[0], 9).is_ok()
        && be.conv_keep(&mut g[0], 0).is_err();
    at_reserve && long && short && regrown
}
