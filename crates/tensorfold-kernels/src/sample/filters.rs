//! A draw's top-k and top-p filters (steps 1 and 2 of [`super::draw`]): the surviving ids in sampling order, sorted only as far as the nucleus reaches.

use super::{SamplingParams, lane_sum, order_key};

/// The top-k and top-p survivors of `logits` (finite, non-empty) in the order of [`order_key`], as [`super::draw`]'s steps 1
/// and 2 say. Sorts only as far as top-p's walk reaches: the first 256 keys, then 16 times as many each time until
/// all (the sorted first keys of a selection are the sort's own prefix, so the kept ids are the same).
pub(super) fn survivors(params: &SamplingParams, logits: &[f32], inv_t: f64) -> Vec<u32> {
    let scaled = |id: u32| f64::from(logits[id as usize]) * inv_t;
    let ids = |keys: &[u64]| keys.iter().map(|&k| k as u32).collect::<Vec<u32>>(); // a key's low 32 bits: the id
    let mut keys: Vec<u64> = logits.iter().enumerate().map(|(i, &x)| order_key(i, x)).collect();
    if params.top_k > 0 && params.top_k < keys.len() {
        keys.select_nth_unstable(params.top_k - 1);
        keys.truncate(params.top_k);
    }
    if params.top_p >= 1.0 {
        keys.sort_unstable();
        return ids(&keys);
    }
    // The top-k survivors are the keys up to the largest one kept; the first is the best score.
    let (first, last) = keys.iter().fold((u64::MAX, 0), |(lo, hi), &k| (lo.min(k), hi.max(k)));
    let s_max = scaled(first as u32);
    let weight = |i: usize| if order_key(i, logits[i]) <= last { (scaled(i as u32) - s_max).exp() } else { 0.0 };
    let z = lane_sum(logits.len(), weight);
    let bound = f64::from(params.top_p) * z;
    let mut m = keys.len().min(256);
    loop {
        if m < keys.len() {
            keys.select_nth_unstable(m - 1);
        }
        keys[..m].sort_unstable();
        let mut mass = 0.0;
        for (j, &k) in keys[..m].iter().enumerate() {
            mass += (scaled(k as u32) - s_max).exp();
            if mass >= bound {
                return ids(&keys[..=j]);
            }
        }
        if m == keys.len() {
            return ids(&keys);
        }
        m = keys.len().min(m * 16);
    }
}
