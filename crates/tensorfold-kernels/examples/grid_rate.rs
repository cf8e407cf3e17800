//! Times the CPU dot grid (`simd::dot_grid`) on bf16 weight rows: GFLOP/s of one thread, the result's bits hashed.
//!
//! `cargo run --release -p tensorfold-kernels --example grid_rate -- K ALIGN`: a 64-row by 16-column grid of
//! K-long rows (default 512), its x rows starting ALIGN bytes past a 64-byte line (default 0; 16 is where glibc
//! puts large blocks). Prints one line a repetition after a warm-up; the hash must not change between builds that
//! claim the same bits. docs/receipts/2026-12-07-cpu-vl-aligned.md used it.

use std::time::Instant;
use tensorfold_kernels::simd::{self, WRow, dot_grid};

fn main() {
    let arg = |i: usize, d: usize| std::env::args().nth(i).and_then(|s| s.parse().ok()).unwrap_or(d);
    let (k, align) = (arg(1, 512).max(1), arg(2, 0) % 64);
    let (na, nb) = (64, 16);
    let value = |i: usize, m: usize| ((i % m) as f32) / (m as f32 / 2.0) - 1.0;
    let wf: Vec<Vec<u16>> =
        (0..nb).map(|r| (0..k).map(|i| (value(i * 5 + r * 3, 97).to_bits() >> 16) as u16).collect()).collect();
    // One buffer, its rows offset so that row 0 starts `align` bytes past a line (k a multiple of 16 keeps them all).
    let mut buf = vec![0f32; na * k + 32];
    let off = (0..32).find(|o| (buf.as_ptr() as usize + 4 * o) % 64 == align / 4 * 4).unwrap_or(0);
    for (i, v) in buf[off..off + na * k].iter_mut().enumerate() {
        *v = value(i * 7 + i / k * 13, 101);
    }
    let xs: Vec<&[f32]> = (0..na).map(|r| &buf[off + r * k..off + (r + 1) * k]).collect();
    let ws: Vec<WRow> = wf.iter().map(|w| WRow::Bf16(w)).collect();
    let mut out = vec![0f32; na * nb];
    let iters = (20_000 * 512 / k).max(1);
    for rep in 0..6 {
        let t = Instant::now();
        for _ in 0..iters {
            dot_grid(simd::level(), &xs, &ws, &mut out, nb);
            std::hint::black_box(&out);
        }
        let s = t.elapsed().as_secs_f64();
        let hash = out.iter().fold(0u32, |h, v| h.rotate_left(5) ^ v.to_bits());
        if rep > 0 {
            let gflops = 2.0 * (na * nb * k * iters) as f64 / s / 1e9;
            println!("k={k} align={align} {:?}: {gflops:.1} GFLOP/s, bits {hash:08x}", simd::level());
        }
    }
}
