//! The kernel contract: every kernel declares a host reference (float64 or exact integer), a claim, the
//! shapes it serves and planted controls (deliberate faults). Gates: 1 it runs; 2 it matches its reference
//! at every served shape on fresh random inputs; 3 row invariance (each row's bits at widths 1, 2, 3, 8,
//! 16, 33 equal the one-row call's); 4 edge cases. A control is red when at least one gate fails with the
//! fault planted; a control that stays green is a gate that cannot see that fault.
//!
//! The CPU suite (`cpu/`) plants its faults by wrapping the real kernel; the CUDA suite (`cuda/`, feature `cuda`)
//! compiles them into the kernels through `tensorfold-kernels`' `planted-faults` feature, which only this crate
//! turns on. Each kernel names its faults by an enum (`faults!`); the reports carry their names.

#[macro_use]
mod faults;
mod cases;
mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
mod shared;

pub use cpu::registry;
pub use faults::{Fault, FaultKind};

use rand::{Rng, SeedableRng, rngs::StdRng};
use std::panic::{AssertUnwindSafe, catch_unwind};

/// Widths of the row-invariance gate.
pub const WIDTHS: [usize; 6] = [1, 2, 3, 8, 16, 33];

/// What a kernel promises about its output.
#[derive(Clone, Debug)]
pub enum Claim {
    /// The same bits as the named kernel or exact computation.
    BitEqual(&'static str),
    /// Within a stated bound of the float64 reference, and why that bound.
    Bound(&'static str),
}

impl std::fmt::Display for Claim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Claim::BitEqual(x) => write!(f, "bit-equal to {x}"),
            Claim::Bound(x) => write!(f, "within {x}"),
        }
    }
}

/// One gate's verdict.
#[derive(Clone, Debug)]
pub struct Gate {
    /// Gate name (`runs`, `reference`, `invariance`, `edges`, ...).
    pub name: &'static str,
    /// Passed?
    pub pass: bool,
    /// Figures behind the verdict.
    pub detail: String,
}

impl Gate {
    /// A gate from a condition and its detail.
    pub fn new(name: &'static str, pass: bool, detail: impl Into<String>) -> Self {
        Self { name, pass, detail: detail.into() }
    }
}

/// Shape set to check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scale {
    /// Small shapes (the test suite).
    Quick,
    /// Every served shape, LFM2.5-24B-A2B's included.
    Served,
}

/// A kernel under contract, with its planted faults as the enum [`Kernel::Fault`].
pub trait Kernel: Sync {
    /// The kernel's planted controls.
    type Fault: FaultKind;
    /// Registry name, e.g. `cpu.linear`.
    fn name(&self) -> &'static str;
    /// Backend.
    fn backend(&self) -> &'static str {
        "cpu"
    }
    /// The claim.
    fn claim(&self) -> Claim;
    /// The reference the gates compare with.
    fn reference(&self) -> &'static str;
    /// Shapes served at `scale`, for the report.
    fn shapes(&self, scale: Scale) -> Vec<String>;
    /// Gates 2 to 4 (and any kernel-specific gate) with `fault` planted, or none.
    fn gates(&self, scale: Scale, fault: Option<Self::Fault>, rng: &mut StdRng) -> Vec<Gate>;
    /// Launch limits of the kernel's device functions (registers, shared memory, threads), read after the gates
    /// ran; empty for the CPU.
    fn limits(&self) -> Vec<String> {
        Vec::new()
    }
}

/// A registered kernel whatever its fault enum (every [`Kernel`] is one): what [`check`] and [`controls`] run.
pub trait Entry: Sync {
    /// Registry name.
    fn name(&self) -> &'static str;
    /// Backend.
    fn backend(&self) -> &'static str;
    /// The claim.
    fn claim(&self) -> Claim;
    /// The reference.
    fn reference(&self) -> &'static str;
    /// Shapes served at `scale`.
    fn shapes(&self, scale: Scale) -> Vec<String>;
    /// The planted controls, in order.
    fn faults(&self) -> Vec<Fault>;
    /// The gates with the `fault`-th control of [`Entry::faults`] planted, or none.
    fn gates_with(&self, scale: Scale, fault: Option<usize>, rng: &mut StdRng) -> Vec<Gate>;
    /// Launch limits.
    fn limits(&self) -> Vec<String>;
}

impl<K: Kernel> Entry for K {
    fn name(&self) -> &'static str {
        Kernel::name(self)
    }
    fn backend(&self) -> &'static str {
        Kernel::backend(self)
    }
    fn claim(&self) -> Claim {
        Kernel::claim(self)
    }
    fn reference(&self) -> &'static str {
        Kernel::reference(self)
    }
    fn shapes(&self, scale: Scale) -> Vec<String> {
        Kernel::shapes(self, scale)
    }
    fn faults(&self) -> Vec<Fault> {
        K::Fault::ALL.iter().map(|f| f.describe()).collect()
    }
    fn gates_with(&self, scale: Scale, fault: Option<usize>, rng: &mut StdRng) -> Vec<Gate> {
        self.gates(scale, fault.map(|i| K::Fault::ALL[i]), rng)
    }
    fn limits(&self) -> Vec<String> {
        Kernel::limits(self)
    }
}

/// A kernel's report.
#[derive(Clone, Debug)]
pub struct KernelReport {
    /// Name.
    pub name: &'static str,
    /// Backend.
    pub backend: &'static str,
    /// Claim.
    pub claim: String,
    /// Reference.
    pub reference: &'static str,
    /// Shapes checked.
    pub shapes: Vec<String>,
    /// Gate 1 (runs) first, then the rest.
    pub gates: Vec<Gate>,
    /// Launch limits of its device functions (empty on the CPU).
    pub limits: Vec<String>,
}

impl KernelReport {
    /// All gates passed?
    pub fn pass(&self) -> bool {
        self.gates.iter().all(|g| g.pass)
    }
}

/// A control's report.
#[derive(Clone, Debug)]
pub struct ControlReport {
    /// Kernel.
    pub kernel: &'static str,
    /// Fault.
    pub fault: Fault,
    /// Gates that went red.
    pub red_gates: Vec<&'static str>,
}

/// Runs `gates` for `k`, turning a panic into a failed `runs` gate (gate 1).
fn run_gates(k: &dyn Entry, scale: Scale, fault: Option<usize>, seed: u64) -> Vec<Gate> {
    let mut rng = StdRng::seed_from_u64(seed);
    match catch_unwind(AssertUnwindSafe(|| k.gates_with(scale, fault, &mut rng))) {
        Ok(mut g) => {
            g.insert(0, Gate::new("runs", true, "no panic"));
            g
        }
        Err(p) => {
            let msg = p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()));
            vec![Gate::new("runs", false, format!("panicked: {}", msg.unwrap_or_default()))]
        }
    }
}

/// Checks one kernel (no fault).
pub fn check(k: &dyn Entry, scale: Scale, seed: u64) -> KernelReport {
    let gates = run_gates(k, scale, None, seed);
    KernelReport {
        name: k.name(),
        backend: k.backend(),
        claim: k.claim().to_string(),
        reference: k.reference(),
        shapes: k.shapes(scale),
        gates,
        limits: k.limits(),
    }
}

/// Plants each of `k`'s faults and records which gates went red.
pub fn controls(k: &dyn Entry, scale: Scale, seed: u64) -> Vec<ControlReport> {
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let out = k
        .faults()
        .into_iter()
        .enumerate()
        .map(|(i, fault)| ControlReport {
            kernel: k.name(),
            fault,
            red_gates: run_gates(k, scale, Some(i), seed).into_iter().filter(|g| !g.pass).map(|g| g.name).collect(),
        })
        .collect();
    std::panic::set_hook(hook);
    out
}

/// A fresh seed for "fresh random inputs" (printed so a failure can be replayed).
pub fn fresh_seed() -> u64 {
    rand::rng().random()
}

/// The last line of `tensorfold contract`.
pub fn summary_line(kernels: &[KernelReport], controls: &[ControlReport]) -> String {
    let kp = kernels.iter().filter(|k| k.pass()).count();
    let red = controls.iter().filter(|c| !c.red_gates.is_empty()).count();
    format!(
        "SUMMARY {} kernels: {} pass, {} fail; {} controls: {} red as planted, {} missed",
        kernels.len(),
        kp,
        kernels.len() - kp,
        controls.len(),
        red,
        controls.len() - red
    )
}
