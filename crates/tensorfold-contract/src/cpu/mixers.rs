//! Contract entries of the stateful and positional CPU kernels: q/k norm + RoPE, attention and the short
//! conv over a segment table (several streams in one call, each reading only its own state).

use super::attn_long;
use crate::cases::*;
use crate::{Claim, Entry, Gate, Kernel, Scale, WIDTHS};
use rand::{Rng, rngs::StdRng};
use tensorfold_kernels::backend::{RopeParams, Segment};
use tensorfold_kernels::cpu::{CpuBackend, CpuConv, CpuKv, attention, conv, ops};
use tensorfold_kernels::prelude::*;

pub fn kernels() -> Vec<Box<dyn Entry>> {
    vec![Box::new(QkRope), Box::new(Attention), Box::new(ShortConv)]
}

struct QkRope;

faults! {
    /// The planted controls of `cpu.qk_norm_rope`.
    enum QkRopeFault {
        WrongPairs = ("wrong-pairs", "rotates the other pairing: (2i, 2i+1) for (i, i + hd/2) and back"),
        PositionOffByOne = ("position-off-by-one", "rotates by position + 1"),
    }
}

impl Kernel for QkRope {
    fn name(&self) -> &'static str {
        "cpu.qk_norm_rope"
    }
    fn claim(&self) -> Claim {
        Claim::Bound("4e-6 of the row's largest output (f32 per-head RMSNorm, then one f32 rotation)")
    }
    fn reference(&self) -> &'static str {
        "float64 per-head RMSNorm then rotation of half-split (NeoX, the LFM2 target) or interleaved (GPT-J, DSpark drafters) pairs by the f32 angle inv_freq * pos (as transformers computes it)"
    }
    fn shapes(&self, scale: Scale) -> Vec<String> {
        match scale {
            Scale::Served => vec!["32 heads x 64 and 8 heads x 64, positions up to 127999, theta 1e6".into()],
            Scale::Quick => vec!["4 heads x 16, positions up to 127999, theta 1e6".into()],
        }
    }
    type Fault = QkRopeFault;
    fn gates(&self, scale: Scale, fault: Option<Self::Fault>, rng: &mut StdRng) -> Vec<Gate> {
        let heads_set: &[(usize, usize)] = if scale == Scale::Served { &[(32, 64), (8, 64)] } else { &[(4, 16)] };
        let eps = 1e-5f32;
        let mut gates = Vec::new();
        for (&(heads, hd), interleaved) in heads_set.iter().flat_map(|h| [(h, false), (h, true)]) {
            let rope = RopeParams { theta: 1e6, head_dim: hd, interleaved };
            let pair = |i: usize| if interleaved { (2 * i, 2 * i + 1) } else { (i, i + hd / 2) };
            let norm: Vec<f32> = uniform(rng, hd).iter().map(|v| 1.0 + 0.2 * v).collect();
            let pos: Vec<usize> = (0..33)
                .map(|i| {
                    if i == 1 {
                        127_999
                    } else if i == 2 {
                        0
                    } else {
                        rng.random_range(0..128_000)
                    }
                })
                .collect();
            let x = uniform(rng, 33 * heads * hd);
            let call = |x: &mut [f32], pos: &[usize]| {
                let segs: Vec<Segment> = pos
                    .iter()
                    .enumerate()
                    .map(|(r, &p)| Segment { first_row: r, rows: 1, start_pos: p, cache: r })
                    .collect();
                let mut v = x.to_vec();
                match fault {
                    Some(QkRopeFault::PositionOffByOne) => {
                        let segs: Vec<Segment> =
                            segs.iter().map(|s| Segment { start_pos: s.start_pos + 1, ..*s }).collect();
                        CpuBackend.qk_norm_rope(&mut v, heads, &norm, eps, rope, &segs).expect("valid segments");
                    }
                    Some(QkRopeFault::WrongPairs) => {
                        let other = RopeParams { interleaved: !rope.interleaved, ..rope };
                        CpuBackend.qk_norm_rope(&mut v, heads, &norm, eps, other, &segs).expect("valid segments");
                    }
                    _ => CpuBackend.qk_norm_rope(&mut v, heads, &norm, eps, rope, &segs).expect("valid segments"),
                }
                x.copy_from_slice(&v);
            };
            let mut out = x.clone();
            call(&mut out, &pos);
            let mut err = 0f64;
            for (r, &p) in pos.iter().enumerate() {
                for h in 0..heads {
                    let xs = wide(&x[(r * heads + h) * hd..(r * heads + h + 1) * hd]);
                    let s = 1.0 / (dot64(&xs, &xs) / hd as f64 + eps as f64).sqrt();
                    let n: Vec<f64> = xs.iter().zip(&norm).map(|(v, w)| v * s * *w as f64).collect();
                    let mut want = vec![0f64; hd];
                    for i in 0..hd / 2 {
                        let a = (ops::rope_inv_freq(1e6, hd, i) * p as f32) as f64;
                        let (ia, ib) = pair(i);
                        want[ia] = n[ia] * a.cos() - n[ib] * a.sin();
                        want[ib] = n[ib] * a.cos() + n[ia] * a.sin();
                    }
                    err = err.max(max_err(&out[(r * heads + h) * hd..(r * heads + h + 1) * hd], &want, max_abs(&want)));
                }
            }
            let style = if interleaved { "interleaved" } else { "half-split" };
            gates.push(reference_gate(&format!("{heads}x{hd} {style}"), err, 4e-6));
            let w = heads * hd;
            let inv: usize = WIDTHS
                .iter()
                .map(|&n| {
                    let mut o = x[..n * w].to_vec();
                    call(&mut o, &pos[..n]);
                    (0..n)
                        .map(|r| {
                            let mut one = x[r * w..(r + 1) * w].to_vec();
                            call(&mut one, &pos[r..r + 1]);
                            bit_diffs(&o[r * w..(r + 1) * w], &one)
                        })
                        .sum::<usize>()
                })
                .sum();
            gates.push(invariance_gate(&format!("{heads}x{hd} {style}"), inv));
            let mut at0 = x[..heads * hd].to_vec();
            call(&mut at0, &[0]);
            let mut normed = vec![0f32; hd];
            ops::rmsnorm_row(&x[..hd], &norm, eps, &mut normed);
            let same = bit_diffs(&at0[..hd], &normed) == 0;
            gates.push(Gate::new(
                "edges",
                same,
                format!("position 0 leaves the normed head unrotated: {same}; position 127999 in the reference set"),
            ));
        }
        merge(gates)
    }
}

/// Attention shapes: (heads, kv_heads, head_dim, cached keys per stream).
fn attn_shape(scale: Scale) -> (usize, usize, usize, Vec<usize>) {
    match scale {
        Scale::Quick => (4, 2, 16, vec![5, 0, 12, 3]),
        Scale::Served => (32, 8, 64, vec![4095, 0, 700, 31]),
    }
}

struct Attention;
impl Attention {
    #[allow(clippy::too_many_arguments)]
    fn call(
        fault: Option<AttentionFault>,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        shape: (usize, usize, usize),
        segs: &[Segment],
        caches: &mut [CpuKv],
        out: &mut [f32],
    ) -> Result<(), tensorfold_kernels::KernelError> {
        let (heads, kvh, hd) = shape;
        let mut refs: Vec<&mut CpuKv> = caches.iter_mut().collect();
        attention::attention(q, k, v, heads, kvh, segs, &mut refs, out)?;
        let Some(f) = fault else { return Ok(()) };
        if f == AttentionFault::ReversedKeysInChunks {
            for s in segs.iter().filter(|s| s.rows > 1) {
                for r in s.first_row..s.first_row + s.rows {
                    let keys = s.start_pos + r - s.first_row + 1;
                    for h in 0..heads {
                        let i = (r * heads + h) * hd;
                        let o = &mut out[i..i + hd];
                        attn_long::attend_reversed(&q[i..i + hd], &caches[s.cache], h / (heads / kvh), hd, keys, o);
                    }
                }
            }
            return Ok(());
        }
        for s in segs {
            for r in s.first_row..s.first_row + s.rows {
                let p = s.start_pos + r - s.first_row;
                let (cache, keys) = match f {
                    AttentionFault::ReadsFirstStream => (&caches[0], (p + 1).min(caches[0].len())),
                    _ => (&caches[s.cache], p),
                };
                for h in 0..heads {
                    let o = &mut out[(r * heads + h) * hd..(r * heads + h + 1) * hd];
                    attention::attend_row(
                        &q[(r * heads + h) * hd..(r * heads + h + 1) * hd],
                        cache,
                        h / (heads / kvh),
                        hd,
                        keys,
                        1.0 / (hd as f32).sqrt(),
                        o,
                    );
                }
            }
        }
        Ok(())
    }
}
faults! {
    /// The planted controls of `cpu.attention`.
    enum AttentionFault {
        ReadsFirstStream = ("reads-first-stream", "every row attends over the first stream's KV rows"),
        SkipsNewestKey = ("skips-newest-key", "a row attends keys [0, pos) (a wrong key count)"),
        ReversedKeysInChunks = ("reversed-keys-in-chunks", "rows of a multi-row call sum their keys newest first"),
    }
}

impl Kernel for Attention {
    fn name(&self) -> &'static str {
        "cpu.attention"
    }
    fn claim(&self) -> Claim {
        Claim::Bound("(2*keys+16)*2^-24*max|v| of float64 (f32 sums in key order of weights that sum to 1)")
    }
    fn reference(&self) -> &'static str {
        "float64 causal GQA softmax attention of each row over its own stream's keys [0, pos]"
    }
    fn shapes(&self, scale: Scale) -> Vec<String> {
        let (h, kv, hd, keys) = attn_shape(scale);
        vec![format!(
            "{h} heads, {kv} KV heads of {hd}; 4 streams holding {keys:?} keys; one stream of 32768 keys; 40 rows \
             over 4090 keys whole and in chunks, beside a 5000-key decode row and a new prompt"
        )]
    }
    type Fault = AttentionFault;
    fn gates(&self, scale: Scale, fault: Option<Self::Fault>, rng: &mut StdRng) -> Vec<Gate> {
        let (heads, kvh, hd, held) = attn_shape(scale);
        let kw = kvh * hd;
        let base: Vec<CpuKv> =
            held.iter().map(|&n| CpuKv { width: kw, k: uniform(rng, n * kw), v: uniform(rng, n * kw) }).collect();
        let shape = (heads, kvh, hd);
        let mut gates = Vec::new();
        let (q, k, v) = (uniform(rng, 33 * heads * hd), uniform(rng, 33 * kw), uniform(rng, 33 * kw));
        let reference = |segs: &[Segment], out: &[f32]| -> f64 {
            let mut err = 0f64;
            for s in segs {
                let c = &base[s.cache];
                for r in s.first_row..s.first_row + s.rows {
                    let keys: Vec<(&[f32], &[f32])> = (0..c.len())
                        .map(|j| (&c.k[j * kw..(j + 1) * kw], &c.v[j * kw..(j + 1) * kw]))
                        .chain((s.first_row..=r).map(|j| (&k[j * kw..(j + 1) * kw], &v[j * kw..(j + 1) * kw])))
                        .collect();
                    for h in 0..heads {
                        let qh = &q[(r * heads + h) * hd..(r * heads + h + 1) * hd];
                        let (want, bound) = attention64(qh, &keys, h / (heads / kvh), hd);
                        err = err.max(max_err(&out[(r * heads + h) * hd..(r * heads + h + 1) * hd], &want, bound));
                    }
                }
            }
            err
        };
        let segs = split(8, 4, &held);
        let mut caches = base.clone();
        let mut out = vec![0f32; 8 * heads * hd];
        let ran =
            Self::call(fault, &q[..8 * heads * hd], &k[..8 * kw], &v[..8 * kw], shape, &segs, &mut caches, &mut out);
        gates.push(reference_gate(
            "8 rows over 4 streams, |err| / bound",
            if ran.is_ok() { reference(&segs, &out) } else { f64::INFINITY },
            1.0,
        ));
        let mut inv = 0;
        for w in WIDTHS {
            let segs = split(w, 4, &held);
            let mut caches = base.clone();
            let mut out = vec![0f32; w * heads * hd];
            if Self::call(fault, &q[..w * heads * hd], &k[..w * kw], &v[..w * kw], shape, &segs, &mut caches, &mut out)
                .is_err()
            {
                inv += 1;
                continue;
            }
            for s in &segs {
                for r in s.first_row..s.first_row + s.rows {
                    let mut solo = base.clone();
                    let before = s.first_row * kw..r * kw;
                    solo[s.cache].k.extend_from_slice(&k[before.clone()]);
                    solo[s.cache].v.extend_from_slice(&v[before]);
                    let seg = [Segment { first_row: 0, rows: 1, start_pos: solo[s.cache].len(), cache: s.cache }];
                    let mut one = vec![0f32; heads * hd];
                    let qr = &q[r * heads * hd..(r + 1) * heads * hd];
                    let _ = Self::call(
                        fault,
                        qr,
                        &k[r * kw..(r + 1) * kw],
                        &v[r * kw..(r + 1) * kw],
                        shape,
                        &seg,
                        &mut solo,
                        &mut one,
                    );
                    inv += bit_diffs(&out[r * heads * hd..(r + 1) * heads * hd], &one);
                }
            }
        }
        gates.push(invariance_gate("widths over 4 streams", inv));
        // Edges: a wrong key count is refused; the longest context still matches its reference.
        let bad = [Segment { first_row: 0, rows: 1, start_pos: held[0] + 1, cache: 0 }];
        let mut c = base.clone();
        let refused = matches!(
            Self::call(fault, &q[..heads * hd], &k[..kw], &v[..kw], shape, &bad, &mut c, &mut vec![0f32; heads * hd]),
            Err(tensorfold_kernels::KernelError::KeyCount { .. })
        );
        let long = if scale == Scale::Served { 32_767 } else { 300 };
        let mut lc = vec![CpuKv { width: kw, k: uniform(rng, long * kw), v: uniform(rng, long * kw) }];
        let lseg = [Segment { first_row: 0, rows: 1, start_pos: long, cache: 0 }];
        let keep = lc.clone();
        let mut lo = vec![0f32; heads * hd];
        let _ = Self::call(fault, &q[..heads * hd], &k[..kw], &v[..kw], shape, &lseg, &mut lc, &mut lo);
        let mut want = vec![0f32; heads * hd];
        let mut exact = keep.clone();
        exact[0].k.extend_from_slice(&k[..kw]);
        exact[0].v.extend_from_slice(&v[..kw]);
        for h in 0..heads {
            attention::attend_row(
                &q[h * hd..(h + 1) * hd],
                &exact[0],
                h / (heads / kvh),
                hd,
                long + 1,
                1.0 / (hd as f32).sqrt(),
                &mut want[h * hd..(h + 1) * hd],
            );
        }
        let long_ok = bit_diffs(&lo, &want) == 0;
        gates.push(Gate::new(
            "edges",
            refused && long_ok,
            format!("key count mismatch refused: {refused}; {} keys equal the unbatched row: {long_ok}", long + 1),
        ));
        let call = |(q, k, v): (&[f32], &[f32], &[f32]), segs: &[Segment], caches: &mut [CpuKv], out: &mut [f32]| {
            Self::call(fault, q, k, v, shape, segs, caches, out).is_ok()
        };
        gates.extend(attn_long::gates(shape, rng, &call));
        merge(gates)
    }
}

struct ShortConv;
impl ShortConv {
    #[allow(clippy::too_many_arguments)]
    fn call(
        fault: Option<ShortConvFault>,
        bcx: &[f32],
        width: usize,
        w: &[f32],
        b: &[f32],
        segs: &[Segment],
        states: &mut [CpuConv],
        out: &mut [f32],
    ) -> Result<(), tensorfold_kernels::KernelError> {
        let before: Vec<CpuConv> = states.to_vec();
        if fault == Some(ShortConvFault::ReadsFirstStream) {
            for s in states.iter_mut().skip(1) {
                s.state = before[0].state.clone();
            }
        }
        let mut refs: Vec<&mut CpuConv> = states.iter_mut().collect();
        conv::short_conv(bcx, width, w, Some(b), segs, &mut refs, out)?;
        if fault == Some(ShortConvFault::StateNotAdvanced) {
            states.clone_from_slice(&before);
        }
        Ok(())
    }
}
faults! {
    /// The planted controls of `cpu.short_conv`.
    enum ShortConvFault {
        ReadsFirstStream = ("reads-first-stream", "every stream reads the first stream's conv state"),
        StateNotAdvanced = ("state-not-advanced", "the conv state is left where it was after the call"),
        KeepAtWindowEnd = ("keep-at-window-end", "a rolled-back window leaves the state at the window's end"),
    }
}

impl Kernel for ShortConv {
    fn name(&self) -> &'static str {
        "cpu.short_conv"
    }
    fn claim(&self) -> Claim {
        Claim::Bound("1e-6 of the row's largest output (taps f32 products summed in order, bias, one gate product)")
    }
    fn reference(&self) -> &'static str {
        "float64 C * (causal depthwise conv of B*x over the stream's state and rows + bias)"
    }
    fn shapes(&self, scale: Scale) -> Vec<String> {
        vec![if scale == Scale::Served {
            "width 2048 (6144-wide B,C,x input), 3 taps, 4 streams".into()
        } else {
            "width 24, 3 taps, 4 streams".into()
        }]
    }
    type Fault = ShortConvFault;
    fn gates(&self, scale: Scale, fault: Option<Self::Fault>, rng: &mut StdRng) -> Vec<Gate> {
        let (width, taps) = (if scale == Scale::Served { 2048 } else { 24 }, 3);
        let hist = taps - 1;
        let base: Vec<CpuConv> =
            (0..4).map(|_| CpuConv { state: uniform(rng, hist * width), ..CpuConv::new(width, taps) }).collect();
        let (w, b) = (uniform(rng, width * taps), uniform(rng, width));
        let bcx = uniform(rng, 33 * 3 * width);
        let bx = |r: usize, c: usize| bcx[r * 3 * width + c] as f64 * bcx[r * 3 * width + 2 * width + c] as f64;
        let starts = [7, 0, 3, 100];
        let segs = split(8, 4, &starts);
        let mut st = base.clone();
        let mut out = vec![0f32; 8 * width];
        let ran = Self::call(fault, &bcx[..8 * 3 * width], width, &w, &b, &segs, &mut st, &mut out).is_ok();
        let mut err = if ran { 0f64 } else { f64::INFINITY };
        let mut advanced = ran;
        for s in &segs {
            let hist_rows: Vec<Vec<f64>> =
                (0..hist).map(|i| wide(&base[s.cache].state[i * width..(i + 1) * width])).collect();
            let rows: Vec<Vec<f64>> =
                (s.first_row..s.first_row + s.rows).map(|r| (0..width).map(|c| bx(r, c)).collect()).collect();
            let all: Vec<&Vec<f64>> = hist_rows.iter().chain(rows.iter()).collect();
            for t in 0..s.rows {
                let r = s.first_row + t;
                let want: Vec<f64> = (0..width)
                    .map(|c| {
                        bcx[r * 3 * width + width + c] as f64
                            * ((0..taps).map(|i| w[c * taps + i] as f64 * all[t + i][c]).sum::<f64>() + b[c] as f64)
                    })
                    .collect();
                err = err.max(max_err(&out[r * width..(r + 1) * width], &want, max_abs(&want)));
            }
            let tail: Vec<f32> = all[all.len() - hist..].iter().flat_map(|v| v.iter().map(|x| *x as f32)).collect();
            advanced &= bit_diffs(&st[s.cache].state, &tail) == 0;
        }
        let mut gates = vec![reference_gate("8 rows over 4 streams", err, 1e-6)];
        let mut inv = 0;
        for n in WIDTHS {
            let segs = split(n, 4, &starts);
            let mut st = base.clone();
            let mut o = vec![0f32; n * width];
            if Self::call(fault, &bcx[..n * 3 * width], width, &w, &b, &segs, &mut st, &mut o).is_err() {
                inv += 1;
                continue;
            }
            for s in &segs {
                for r in s.first_row..s.first_row + s.rows {
                    let mut solo = base.clone();
                    if r > s.first_row {
                        let prep = [Segment { first_row: 0, rows: r - s.first_row, start_pos: 0, cache: s.cache }];
                        let mut sink = vec![0f32; (r - s.first_row) * width];
                        let mut refs: Vec<&mut CpuConv> = solo.iter_mut().collect();
                        conv::short_conv(
                            &bcx[s.first_row * 3 * width..r * 3 * width],
                            width,
                            &w,
                            Some(&b),
                            &prep,
                            &mut refs,
                            &mut sink,
                        )
                        .expect("valid");
                    }
                    let seg = [Segment { first_row: 0, rows: 1, start_pos: 0, cache: s.cache }];
                    let mut one = vec![0f32; width];
                    let _ = Self::call(
                        fault,
                        &bcx[r * 3 * width..(r + 1) * 3 * width],
                        width,
                        &w,
                        &b,
                        &seg,
                        &mut solo,
                        &mut one,
                    );
                    inv += bit_diffs(&o[r * width..(r + 1) * width], &one);
                }
            }
        }
        gates.push(invariance_gate("widths over 4 streams", inv));
        let mut wrong = [CpuConv::new(width, taps + 1)];
        let mut refs: Vec<&mut CpuConv> = wrong.iter_mut().collect();
        let seg = [Segment { first_row: 0, rows: 1, start_pos: 0, cache: 0 }];
        let refused =
            conv::short_conv(&bcx[..3 * width], width, &w, Some(&b), &seg, &mut refs, &mut vec![0f32; width]).is_err();
        // Rollback: a 5-row window kept to 2 rows leaves the state a 2-row call leaves.
        let seg5 = [Segment { first_row: 0, rows: 5, start_pos: 0, cache: 0 }];
        let seg2 = [Segment { first_row: 0, rows: 2, start_pos: 0, cache: 0 }];
        let (mut w5, mut w2) = ([base[0].clone()], [base[0].clone()]);
        let mut sink = vec![0f32; 5 * width];
        conv::short_conv(&bcx[..15 * width], width, &w, Some(&b), &seg5, &mut [&mut w5[0]], &mut sink).expect("valid");
        conv::short_conv(&bcx[..6 * width], width, &w, Some(&b), &seg2, &mut [&mut w2[0]], &mut sink[..2 * width])
            .expect("valid");
        let kept = match fault {
            Some(ShortConvFault::KeepAtWindowEnd) => Ok(()),
            _ => w5[0].keep(2),
        };
        let rolled = kept.is_ok() && bit_diffs(&w5[0].state, &w2[0].state) == 0;
        gates.push(Gate::new(
            "edges",
            refused && advanced && rolled,
            format!(
                "mismatched state refused: {refused}; state holds the last {hist} rows of B*x: {advanced}; \
                 a 5-row window kept to 2 rows equals a 2-row call: {rolled}"
            ),
        ));
        gates
    }
}
