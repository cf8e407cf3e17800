//! Times one draw over a 65,536-id vocabulary (the LFM2 vocabulary's size): greedy, temperature 1, and temperature 1 with top-p 0.95, 200 positions each, with a checksum of the drawn ids to compare builds.
//!
//! `cargo run --release -p tensorfold-kernels --example draw_time` (the receipt `docs/receipts/2026-12-07-cpu-draw.md`).

use std::time::Instant;
use tensorfold_kernels::sample::{SamplingParams, draw};

/// Positions drawn per setting.
const DRAWS: u64 = 200;

fn main() {
    // Seeded logits spread over 14 units (most of a vocabulary within reach at temperature 1), one clear leader.
    let mut z: u64 = 1;
    let mut logits: Vec<f32> = (0..65_536)
        .map(|_| {
            z = z.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            let u = (z >> 40) as f32 / (1u64 << 24) as f32;
            -8.0 + 14.0 * u * u
        })
        .collect();
    logits[123] = 18.0;
    let greedy = SamplingParams::greedy();
    let t1 = SamplingParams { temperature: 1.0, seed: 7, ..greedy };
    for (name, p) in
        [("greedy", greedy), ("temperature 1", t1), ("temperature 1, top-p 0.95", SamplingParams { top_p: 0.95, ..t1 })]
    {
        let t = Instant::now();
        let sum: u64 = (0..DRAWS).map(|pos| u64::from(draw(&p, pos, &logits).expect("finite logits"))).sum();
        println!("{name}: {:.1} us a draw (sum of ids {sum})", t.elapsed().as_secs_f64() * 1e6 / DRAWS as f64);
    }
}
