//! The tiled causal attention against the one-row reference, bit for bit: chunked, concurrent, long contexts.

use super::*;

fn data(n: usize, seed: u64) -> Vec<f32> {
    let mut z = seed;
    (0..n)
        .map(|_| {
            z = z.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((z >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// Runs `attention` for `segs` over caches that held `held` keys, and checks every row head against
/// `attend_row` over the same keys.
fn check(heads: usize, kv_heads: usize, hd: usize, held: &[usize], segs: &[Segment]) {
    let w = kv_heads * hd;
    let rows = segs.iter().map(|s| s.first_row + s.rows).max().unwrap_or(0);
    let (q, k, v) = (data(rows * heads * hd, 1), data(rows * w, 2), data(rows * w, 3));
    let mut caches: Vec<CpuKv> = held
        .iter()
        .enumerate()
        .map(|(i, &n)| CpuKv { width: w, k: data(n * w, 10 + i as u64), v: data(n * w, 20 + i as u64) })
        .collect();
    let mut out = vec![f32::NAN; rows * heads * hd];
    let mut refs: Vec<&mut CpuKv> = caches.iter_mut().collect();
    attention(&q, &k, &v, heads, kv_heads, segs, &mut refs, &mut out).expect("valid call");
    let scale = 1.0 / (hd as f32).sqrt();
    for s in segs {
        for r in s.first_row..s.first_row + s.rows {
            let keys = s.start_pos + r - s.first_row + 1;
            for h in 0..heads {
                let i = (r * heads + h) * hd;
                let mut want = vec![0f32; hd];
                attend_row(&q[i..i + hd], &caches[s.cache], h / (heads / kv_heads), hd, keys, scale, &mut want);
                let got: Vec<u32> = out[i..i + hd].iter().map(|v| v.to_bits()).collect();
                let want: Vec<u32> = want.iter().map(|v| v.to_bits()).collect();
                assert_eq!(got, want, "row {r} head {h} keys {keys}");
            }
        }
    }
}

#[test]
fn tiles_give_the_one_row_bits() {
    // The default pair's shape (8 heads, 2 KV heads of 32) and odd ones (a tail chunk, no grouping).
    for (heads, kvh, hd) in [(8, 2, 32), (4, 4, 17), (6, 2, 64), (3, 1, 8)] {
        let segs = [
            Segment { first_row: 0, rows: 13, start_pos: 0, cache: 0 },
            Segment { first_row: 13, rows: 1, start_pos: 40, cache: 1 },
            Segment { first_row: 14, rows: 9, start_pos: 70, cache: 2 },
        ];
        check(heads, kvh, hd, &[0, 40, 70], &segs);
    }
}

#[test]
fn long_contexts_give_the_one_row_bits() {
    let segs = [Segment { first_row: 0, rows: 11, start_pos: 4100, cache: 0 }];
    check(8, 2, 32, &[4100], &segs);
}

/// Prefill timing of one attention layer of the default pair's shape (`--ignored --nocapture`).
#[test]
#[ignore]
fn time_prefill_layer() {
    for n in [512usize, 2048] {
        let (heads, kvh, hd) = (8, 2, 32);
        let w = kvh * hd;
        let (q, k, v) = (data(n * heads * hd, 1), data(n * w, 2), data(n * w, 3));
        let segs = [Segment { first_row: 0, rows: n, start_pos: 0, cache: 0 }];
        let mut out = vec![0f32; n * heads * hd];
        let t = std::time::Instant::now();
        for _ in 0..3 {
            let mut c = CpuKv { width: w, k: Vec::new(), v: Vec::new() };
            attention(&q, &k, &v, heads, kvh, &segs, &mut [&mut c], &mut out).expect("valid");
        }
        println!("attention {n} rows: {:.2} ms a layer", t.elapsed().as_secs_f64() * 1e3 / 3.0);
        let mut c = CpuKv { width: w, k: k.clone(), v: v.clone() };
        let t = std::time::Instant::now();
        let scale = 1.0 / (hd as f32).sqrt();
        let ptr = SendPtr(out.as_mut_ptr());
        (0..n * heads).into_par_iter().for_each(|i| {
            // SAFETY: each task writes its own head.
            let o = unsafe { std::slice::from_raw_parts_mut(ptr.at(i * hd), hd) };
            attend_row(&q[i * hd..(i + 1) * hd], &c, (i % heads) / 4, hd, i / heads + 1, scale, o);
        });
        c.k.clear();
        println!("one-row kernel {n} rows: {:.2} ms a layer", t.elapsed().as_secs_f64() * 1e3);
    }
}
