//! `cpu.attention`'s gates at long key counts (4,096 and more), where the tiled kernel's key blocks and query tiles
//! are many: a chunked prefill equals the whole one and concurrent streams equal each alone, bit for bit, and rows
//! still meet their float64 reference.

use crate::Gate;
use crate::cases::*;
use rand::rngs::StdRng;
use tensorfold_kernels::Segment;
use tensorfold_kernels::cpu::CpuKv;

/// Keys a long stream holds before its rows: its rows cross 4,096 keys.
const HELD: usize = 4090;
/// Rows of the long prefill; the chunked run takes them in these chunks.
const ROWS: usize = 40;
const CHUNKS: [usize; 4] = [1, 7, 13, 19];

/// One attention call on `caches` (the entry's call, its fault planted): `(q, k, v)` rows, segments, output.
pub(super) type Call<'a> = dyn Fn((&[f32], &[f32], &[f32]), &[Segment], &mut [CpuKv], &mut [f32]) -> bool + 'a;

/// The long gates for `(heads, kv_heads, head_dim)`.
pub(super) fn gates(shape: (usize, usize, usize), rng: &mut StdRng, call: &Call) -> Vec<Gate> {
    let (heads, kvh, hd) = shape;
    let (qw, kw) = (heads * hd, kvh * hd);
    let held = [HELD, 5000, 0];
    let base: Vec<CpuKv> =
        held.iter().map(|&n| CpuKv { width: kw, k: uniform(rng, n * kw), v: uniform(rng, n * kw) }).collect();
    let n = ROWS + 1 + 5;
    let (q, k, v) = (uniform(rng, n * qw), uniform(rng, n * kw), uniform(rng, n * kw));
    let rows = |r: std::ops::Range<usize>| {
        (&q[r.start * qw..r.end * qw], &k[r.start * kw..r.end * kw], &v[r.start * kw..r.end * kw])
    };
    // Whole: the long stream's rows in one call.
    let mut whole = vec![0f32; ROWS * qw];
    let mut cw = base.clone();
    let seg = [Segment { first_row: 0, rows: ROWS, start_pos: HELD, cache: 0 }];
    let mut ok = call(rows(0..ROWS), &seg, &mut cw, &mut whole);
    // Chunked: the same rows in calls of several sizes, each appending to the cache.
    let mut chunked = vec![0f32; ROWS * qw];
    let mut cc = base.clone();
    let mut at = 0;
    for c in CHUNKS {
        let seg = [Segment { first_row: 0, rows: c, start_pos: HELD + at, cache: 0 }];
        ok &= call(rows(at..at + c), &seg, &mut cc, &mut chunked[at * qw..(at + c) * qw]);
        at += c;
    }
    let chunk_diffs = if ok { bit_diffs(&whole, &chunked) } else { usize::MAX };
    let err = reference(&base[0], (&q, &k, &v), shape, &whole);
    // Concurrent: the long prefill, a decode row of a 5,000-key stream and a fresh 5-row prompt in one call.
    let segs = [
        Segment { first_row: 0, rows: ROWS, start_pos: HELD, cache: 0 },
        Segment { first_row: ROWS, rows: 1, start_pos: 5000, cache: 1 },
        Segment { first_row: ROWS + 1, rows: 5, start_pos: 0, cache: 2 },
    ];
    let mut all = vec![0f32; n * qw];
    let mut ca = base.clone();
    let mut solo_diffs = if call(rows(0..n), &segs, &mut ca, &mut all) { 0 } else { usize::MAX / 2 };
    for s in &segs {
        let mut alone = vec![0f32; s.rows * qw];
        let mut cs = base.clone();
        let one = [Segment { first_row: 0, ..*s }];
        let ran = call(rows(s.first_row..s.first_row + s.rows), &one, &mut cs, &mut alone);
        let got = &all[s.first_row * qw..(s.first_row + s.rows) * qw];
        solo_diffs = solo_diffs.saturating_add(if ran { bit_diffs(got, &alone) } else { usize::MAX / 2 });
    }
    vec![
        reference_gate(&format!("{ROWS} rows at keys {}..{}, |err| / bound", HELD + 1, HELD + ROWS), err, 1.0),
        invariance_gate(
            &format!("{ROWS} rows over {HELD}+ keys in chunks of {CHUNKS:?} against one call"),
            chunk_diffs,
        ),
        invariance_gate(
            "a 4,090+-key prefill, a 5,000-key decode and a new prompt together against each alone",
            solo_diffs,
        ),
    ]
}

/// The largest `|err| / bound` of the first, a middle and the last of the whole call's rows against float64.
fn reference(c: &CpuKv, (q, k, v): (&[f32], &[f32], &[f32]), shape: (usize, usize, usize), out: &[f32]) -> f64 {
    let (heads, kvh, hd) = shape;
    let kw = kvh * hd;
    let mut err = 0f64;
    for r in [0, ROWS / 2, ROWS - 1] {
        let keys: Vec<(&[f32], &[f32])> = (0..c.len())
            .map(|j| (&c.k[j * kw..(j + 1) * kw], &c.v[j * kw..(j + 1) * kw]))
            .chain((0..=r).map(|j| (&k[j * kw..(j + 1) * kw], &v[j * kw..(j + 1) * kw])))
            .collect();
        for h in 0..heads {
            let i = (r * heads + h) * hd;
            let (want, bound) = attention64(&q[i..i + hd], &keys, h / (heads / kvh), hd);
            err = err.max(max_err(&out[i..i + hd], &want, bound));
        }
    }
    err
}

/// The planted control `reversed-keys-in-chunks`: one row's attention with its exponentials summed and its values
/// accumulated from the newest key back (a plausible tiling bug: bounded error, other bits).
pub(super) fn attend_reversed(q: &[f32], cache: &CpuKv, kvh: usize, hd: usize, keys: usize, out: &mut [f32]) {
    let w = cache.width;
    let row = |m: &[f32], j: usize| -> Vec<f32> { m[j * w + kvh * hd..j * w + (kvh + 1) * hd].to_vec() };
    let scale = 1.0 / (hd as f32).sqrt();
    let s: Vec<f32> =
        (0..keys).map(|j| row(&cache.k, j).iter().zip(q).map(|(a, b)| a * b).sum::<f32>() * scale).collect();
    let max = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let e: Vec<f32> = s.iter().map(|x| (x - max).exp()).collect();
    let sum: f32 = e.iter().rev().sum();
    out.fill(0.0);
    for j in (0..keys).rev() {
        for (o, x) in out.iter_mut().zip(row(&cache.v, j)) {
            *o += e[j] * x;
        }
    }
    out.iter_mut().for_each(|o| *o /= sum);
}
