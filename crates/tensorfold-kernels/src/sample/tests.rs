//! The keyed draw against a brute-force reference, across levels, filters and extreme scales.

use super::*;

fn sampled(seed: u64) -> SamplingParams {
    SamplingParams { temperature: 1.0, seed, ..SamplingParams::greedy() }
}

/// Brute-force reference of `draw` for sampled params: no skipping, explicit sets.
fn reference(p: &SamplingParams, position: u64, logits: &[f32]) -> u32 {
    let t = f64::from(p.temperature);
    let mut ids: Vec<u32> = (0..logits.len() as u32).collect();
    ids.sort_by(|&a, &b| logits[b as usize].partial_cmp(&logits[a as usize]).unwrap().then(a.cmp(&b)));
    if p.top_k > 0 && p.top_k < ids.len() {
        ids.truncate(p.top_k);
    }
    let s = |id: u32| f64::from(logits[id as usize]) / t;
    let s_max = s(ids[0]);
    if p.top_p < 1.0 {
        let kept: std::collections::HashSet<u32> = ids.iter().copied().collect();
        let z = lane_sum(logits.len(), |i| if kept.contains(&(i as u32)) { (s(i as u32) - s_max).exp() } else { 0.0 });
        let mut mass = 0.0;
        let mut keep = ids.len();
        for (j, &i) in ids.iter().enumerate() {
            mass += (s(i) - s_max).exp();
            if mass >= f64::from(p.top_p) * z {
                keep = j + 1;
                break;
            }
        }
        ids.truncate(keep);
    }
    ids.retain(|&i| (s(i) - s_max).exp() >= f64::from(p.min_p));
    let key = position_key(p.seed, position);
    let mut best = (f64::NEG_INFINITY, u32::MAX);
    for &i in &ids {
        let score = s(i) + gumbel(key, i);
        if score > best.0 || (score == best.0 && i < best.1) {
            best = (score, i);
        }
    }
    best.1
}

/// Draws over wide logit spreads (where most tokens are skipped by their uniform) equal the brute-force
/// reference, and the floor is exact at its ends: a token a unit of noise short still runs its logarithms.
#[test]
fn skipping_by_the_uniform_keeps_every_draw() {
    let mut state = 0x1234_5678_u64;
    for spread in [1.0f32, 4.0, 12.0, 30.0, 60.0] {
        let logits: Vec<f32> = (0..2_000)
            .map(|_| {
                state = mix64(state.wrapping_add(GAMMA));
                (state >> 40) as f32 / (1u64 << 24) as f32 * spread
            })
            .collect();
        for pos in 0..200 {
            for t in [0.5f32, 1.0, 2.0] {
                let p = SamplingParams { temperature: t, seed: 9, ..SamplingParams::greedy() };
                assert_eq!(draw(&p, pos, &logits).unwrap(), reference(&p, pos, &logits), "spread {spread} pos {pos}");
            }
        }
    }
    assert_eq!(uniform_floor(uniform_floors(), 1.99), 0.0);
    for need in [2.0, 2.5, 7.9, 39.0, 1e30] {
        let floor = uniform_floor(uniform_floors(), need);
        // A floor of 1 skips every uniform: only right where even the largest noise is a unit short.
        let largest = noise(1.0 - 2f64.powi(-53));
        let ok = if floor == 1.0 { largest <= need.floor() - 1.0 } else { noise(floor) <= need.floor() - 1.0 + 1e-9 };
        assert!(floor > 0.0 && ok, "need {need}: floor {floor}, its noise {}", noise(floor));
    }
}

#[test]
fn greedy_ties_go_to_lower_id() {
    assert_eq!(greedy_pick(&[1.0, 3.0, 3.0, 2.0]), Ok(1));
    assert_eq!(greedy_pick(&[5.0, 5.0]), Ok(0));
    assert_eq!(greedy_pick(&[-1.0]), Ok(0));
    assert_eq!(draw(&SamplingParams::greedy(), 9, &[0.0, 7.0, 7.0]), Ok(1));
}

#[test]
fn bad_logits_are_named() {
    assert_eq!(greedy_pick(&[0.0, f32::NAN, 1.0]), Err(SampleError::NonFinite { index: 1 }));
    assert_eq!(greedy_pick(&[0.0, 1.0, f32::INFINITY]), Err(SampleError::NonFinite { index: 2 }));
    assert_eq!(draw(&sampled(1), 0, &[f32::NEG_INFINITY, 0.0]), Err(SampleError::NonFinite { index: 0 }));
    assert_eq!(greedy_pick(&[]), Err(SampleError::EmptyLogits));
    assert_eq!(draw(&sampled(1), 0, &[]), Err(SampleError::EmptyLogits));
}

#[test]
fn draws_are_pure_functions_of_seed_position_logits() {
    let logits: Vec<f32> = (0..50).map(|i| ((i * 37) % 11) as f32 * 0.3).collect();
    for pos in 0..100 {
        let a = draw(&sampled(42), pos, &logits).unwrap();
        let b = draw(&sampled(42), pos, &logits).unwrap();
        assert_eq!(a, b);
    }
    let run = |seed| -> Vec<u32> { (0..64).map(|pos| draw(&sampled(seed), pos, &logits).unwrap()).collect() };
    assert_eq!(run(7), run(7));
    assert_ne!(run(7), run(8));
}

#[test]
fn positions_spread_uniformly() {
    let logits = [0.0f32; 8];
    let mut counts = [0usize; 8];
    for pos in 0..2_000 {
        counts[draw(&sampled(3), pos, &logits).unwrap() as usize] += 1;
    }
    for (id, &c) in counts.iter().enumerate() {
        assert!((150..=350).contains(&c), "token {id} drawn {c} times");
    }
}

#[test]
fn frequencies_match_the_distribution() {
    let probs = [0.6f64, 0.3, 0.1];
    let logits: Vec<f32> = probs.iter().map(|p| p.ln() as f32).collect();
    let mut counts = [0usize; 3];
    let n = 20_000;
    for pos in 0..n {
        counts[draw(&sampled(11), pos, &logits).unwrap() as usize] += 1;
    }
    for (c, p) in counts.iter().zip(probs) {
        let freq = *c as f64 / n as f64;
        assert!((freq - p).abs() < 0.02, "freq {freq} vs p {p}");
    }
}

#[test]
fn degenerate_filters_equal_greedy() {
    // Distinct logits (13 is invertible mod 41): min_p = 1 keeps exactly the maximum.
    let logits: Vec<f32> = (0..40).map(|i| ((i * 13) % 41) as f32 * 0.25).collect();
    let g = greedy_pick(&logits).unwrap();
    for pos in 0..200 {
        for p in [
            SamplingParams { top_k: 1, ..sampled(5) },
            SamplingParams { top_p: 1e-6, ..sampled(5) },
            SamplingParams { min_p: 1.0, ..sampled(5) },
        ] {
            assert_eq!(draw(&p, pos, &logits), Ok(g), "{p:?} at {pos}");
        }
    }
    let separated = [0.0f32, 1.0, 3.0, 2.0];
    let cold = SamplingParams { temperature: 1e-4, ..sampled(5) };
    for pos in 0..200 {
        assert_eq!(draw(&cold, pos, &separated), Ok(2));
    }
}

#[test]
fn filters_restrict_the_support() {
    let logits = [2.0f32, 1.9, 1.8, 0.0, -1.0];
    for pos in 0..500 {
        let k2 = draw(&SamplingParams { top_k: 2, ..sampled(9) }, pos, &logits).unwrap();
        assert!(k2 < 2);
        // exp(0 - 2) = 0.135 < 0.2 and exp(-3) too: only ids 0..3 survive min_p 0.2.
        let mp = draw(&SamplingParams { min_p: 0.2, ..sampled(9) }, pos, &logits).unwrap();
        assert!(mp < 3);
        // p = (0.329, 0.298, 0.269, 0.045, 0.017): top_p 0.6 keeps ids 0 and 1.
        let tp = draw(&SamplingParams { top_p: 0.6, ..sampled(9) }, pos, &logits).unwrap();
        assert!(tp < 2);
    }
}

/// Extreme scales keep the reference's ids at every level: temperatures from 1e-30 to 1e30, logits near
/// f32::MAX, under top-p (whose normaliser is taken from the best score: a wrong one overflows or rounds).
#[test]
fn extreme_scales_match_the_reference() {
    let spread = |scale: f32| -> Vec<f32> {
        (0..300u64).map(|i| ((mix64(i ^ 3) % 2_001) as f32 / 1_000.0 - 1.0) * scale).collect()
    };
    for (scale, t) in [(f32::MAX, 1.0), (1e30, 1e-30), (1.0, 1e-30), (1e-30, 1e30), (3.0e38, 0.5), (1.0, 3.0e38)] {
        let logits = spread(scale);
        for (top_k, top_p, min_p) in [(0, 0.9, 0.0), (0, 1e-7, 0.0), (40, 0.95, 0.05), (0, 1.0, 0.1)] {
            let p = SamplingParams { temperature: t, top_k, top_p, min_p, seed: 13 };
            for pos in 0..4 {
                let want = reference(&p, pos, &logits);
                assert_eq!(draw(&p, pos, &logits).unwrap(), want, "scale {scale} t {t} top_p {top_p}");
                assert_eq!(draw_at(Level::Portable, &p, pos, &logits).unwrap(), want, "portable, scale {scale}");
            }
        }
    }
    // Three leaders within a unit and the rest 1,000 below: top-p 0.9 keeps all three only if its weights are
    // taken from the best score (from the last survivor's, exp(1000) overflows and one is kept).
    let mut logits = vec![0.0f32; 300];
    logits[..3].copy_from_slice(&[1_000.0, 1_000.0, 999.5]);
    let p = SamplingParams { top_p: 0.9, ..sampled(17) };
    let drawn: Vec<u32> = (0..16).map(|pos| draw(&p, pos, &logits).unwrap()).collect();
    assert_eq!(drawn, (0..16).map(|pos| reference(&p, pos, &logits)).collect::<Vec<_>>());
    assert!(drawn.iter().any(|&id| id != 0), "the nucleus holds three ids: {drawn:?}");
}

/// Top-p walks that pass the first 256 and 4,096 sorted keys (flat logits) keep the reference's ids.
#[test]
fn long_top_p_walks_match_the_reference() {
    let logits: Vec<f32> = (0..6_000u64).map(|i| (mix64(i ^ 5) % 1_000) as f32 / 1_000.0).collect();
    for (top_k, top_p) in [(0, 0.99), (0, 0.5), (0, 0.03), (5_000, 0.9), (300, 0.95)] {
        let p = SamplingParams { top_k, top_p, ..sampled(11) };
        for pos in 0..6 {
            assert_eq!(draw(&p, pos, &logits).unwrap(), reference(&p, pos, &logits), "top_k {top_k} top_p {top_p}");
        }
    }
}

/// The whole-vocabulary scan and pick give the portable level's ids at every level, at a vocabulary's size and
/// odd tails, across temperatures and min-p, and equal the brute-force reference (on a CPU without AVX-512 both
/// sides are the scalar form).
#[test]
fn every_level_draws_the_same_id() {
    for (n, spread) in [(65_536usize, 30.0f32), (50_003, 8.0), (37, 3.0)] {
        let logits: Vec<f32> = (0..n as u64).map(|i| (mix64(i ^ 77) % 10_000) as f32 / 10_000.0 * spread).collect();
        for (t, min_p) in [(1.0, 0.0), (0.7, 0.0), (1.6, 0.02), (0.05, 0.0)] {
            let p = SamplingParams { temperature: t, min_p, ..sampled(9) };
            for pos in 0..12 {
                let want = draw_at(Level::Portable, &p, pos, &logits).unwrap();
                assert_eq!(draw_at(crate::simd::level(), &p, pos, &logits).unwrap(), want, "n {n} t {t} pos {pos}");
                if n < 100 {
                    assert_eq!(want, reference(&p, pos, &logits));
                }
            }
        }
    }
}

#[test]
fn draw_matches_brute_force_reference() {
    let logits: Vec<f32> = (0..300u64).map(|i| (mix64(i) % 2_000) as f32 / 100.0 - 10.0).collect();
    let cases = [
        sampled(1),
        SamplingParams { temperature: 0.7, ..sampled(2) },
        SamplingParams { top_k: 20, ..sampled(3) },
        SamplingParams { top_p: 0.9, ..sampled(4) },
        SamplingParams { min_p: 0.05, ..sampled(5) },
        SamplingParams { temperature: 0.3, top_k: 50, top_p: 0.8, min_p: 0.1, seed: 6 },
    ];
    for p in cases {
        for pos in 0..100 {
            assert_eq!(draw(&p, pos, &logits).unwrap(), reference(&p, pos, &logits));
        }
    }
}

#[test]
fn invalid_params_are_refused_by_name() {
    let name = |p: SamplingParams| match p.validate() {
        Err(SampleError::InvalidParam { name, .. }) => name,
        other => panic!("expected InvalidParam, got {other:?}"),
    };
    assert_eq!(name(SamplingParams { temperature: -0.1, ..sampled(0) }), "temperature");
    assert_eq!(name(SamplingParams { temperature: f32::NAN, ..sampled(0) }), "temperature");
    assert_eq!(name(SamplingParams { temperature: f32::INFINITY, ..sampled(0) }), "temperature");
    assert_eq!(name(SamplingParams { top_p: 0.0, ..sampled(0) }), "top_p");
    assert_eq!(name(SamplingParams { top_p: 1.5, ..sampled(0) }), "top_p");
    assert_eq!(name(SamplingParams { top_p: f32::NAN, ..sampled(0) }), "top_p");
    assert_eq!(name(SamplingParams { min_p: -0.5, ..sampled(0) }), "min_p");
    assert_eq!(name(SamplingParams { min_p: 1.01, ..sampled(0) }), "min_p");
    let bad = SamplingParams { top_p: 2.0, ..sampled(0) };
    assert!(matches!(draw(&bad, 0, &[1.0, 2.0]), Err(SampleError::InvalidParam { name: "top_p", .. })));
    assert_eq!(sampled(0).validate(), Ok(()));
    assert_eq!(SamplingParams::greedy().validate(), Ok(()));
    assert!(SamplingParams::greedy().is_greedy() && !sampled(0).is_greedy());
}

#[test]
fn uniforms_stay_inside_the_open_interval() {
    for key in [0u64, u64::MAX, 12345] {
        for token in [0u32, 1, u32::MAX] {
            let u = keyed_uniform(key, token);
            assert!(u > 0.0 && u < 1.0);
            let g = gumbel(key, token);
            assert!(g.is_finite() && g < GUMBEL_MAX);
        }
    }
    // The extreme uniforms still give finite noise under the bound.
    let hi: f64 = 1.0 - 2f64.powi(-53);
    let lo: f64 = 2f64.powi(-53);
    assert!((-(-hi.ln()).ln()) < GUMBEL_MAX && (-(-lo.ln()).ln()).is_finite());
}
