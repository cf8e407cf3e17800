//! The CPU suite: every kernel of the CPU backend, its faults planted by wrapping the real kernel (so the backend
//! carries no fault switches).

mod affine;
mod attn_long;
mod dense;
mod drafter;
mod mixers;

use crate::Entry;

/// Every registered CPU kernel.
pub fn registry() -> Vec<Box<dyn Entry>> {
    let mut v: Vec<Box<dyn Entry>> = Vec::new();
    v.extend(dense::kernels());
    v.push(Box::new(affine::Affine4And8));
    v.extend(mixers::kernels());
    v.extend(drafter::kernels());
    v
}
