//! Compares `simd::exp` with the host libm's `f32::exp` on all 2^32 inputs, and every level with the scalar form.
//!
//! `cargo run --release -p tensorfold-kernels --example exp_check` (about 3 minutes, one thread). Prints the number of
//! inputs where they differ and the first of them; exits 1 if any differ.

use tensorfold_kernels::simd::{self, exp};

fn main() {
    let levels = simd::available_levels();
    let (mut libm, mut levels_off, mut first) = (0u64, 0u64, None);
    let mut chunk = vec![0f32; 1 << 16];
    for hi in 0..=u16::MAX {
        let base = u32::from(hi) << 16;
        for lv in &levels {
            for (i, v) in chunk.iter_mut().enumerate() {
                *v = f32::from_bits(base | i as u32);
            }
            exp::exp_in_place(*lv, &mut chunk);
            for (i, v) in chunk.iter().enumerate() {
                let x = f32::from_bits(base | i as u32);
                if v.to_bits() != exp::expf(x).to_bits() {
                    levels_off += 1;
                    first.get_or_insert(x);
                }
            }
        }
        for i in 0..1u32 << 16 {
            let x = f32::from_bits(base | i);
            if exp::expf(x).to_bits() != x.exp().to_bits() {
                libm += 1;
                first.get_or_insert(x);
            }
        }
    }
    println!(
        "levels {levels:?}: {levels_off} differ from the scalar form; libm: {libm} of 2^32 differ; first {first:?}"
    );
    std::process::exit(i32::from(libm + levels_off > 0));
}
