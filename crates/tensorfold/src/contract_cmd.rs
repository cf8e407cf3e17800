//! `tensorfold contract`: every registered kernel through its gates, then the planted controls (the
//! `tensorfold-contract` crate; a build without the `contract` feature says how to get one).

use anyhow::bail;
use std::process::ExitCode;
#[cfg(feature = "contract")]
use tensorfold_contract::{self as contract, Entry, Scale};

/// Arguments of `tensorfold contract`.
#[derive(clap::Args)]
#[cfg_attr(not(feature = "contract"), allow(dead_code))]
pub struct Args {
    /// Backend whose kernels to check: cpu, or cuda[:N] (GPU N, default 0; builds with the `cuda` feature).
    #[arg(long, default_value = "cpu")]
    backend: String,
    /// Check only the kernel of this name (e.g. cpu.linear).
    #[arg(long)]
    only: Option<String>,
    /// Small shapes only (what the test suite runs), instead of every served shape.
    #[arg(long)]
    quick: bool,
    /// Seed of the random inputs (default: fresh; printed so a failure can be replayed).
    #[arg(long)]
    seed: Option<u64>,
}

/// Without the `contract` feature there is no contract to run (a release build of the server carries none).
#[cfg(not(feature = "contract"))]
pub fn run(_: Args) -> anyhow::Result<ExitCode> {
    bail!("this build has no kernel contract: build with `--features contract` (it plants faults in the kernels)")
}

/// Runs the command.
#[cfg(feature = "contract")]
pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let scale = if a.quick { Scale::Quick } else { Scale::Served };
    let seed = a.seed.unwrap_or_else(contract::fresh_seed);
    let (registry, backend) = registry(&a.backend)?;
    let names: Vec<&str> = registry.iter().map(|k| k.name()).collect();
    let names = names.join(", ");
    let kernels: Vec<_> = registry.into_iter().filter(|k| a.only.as_deref().is_none_or(|o| o == k.name())).collect();
    if kernels.is_empty() {
        bail!("no kernel named {:?}; registered: {names}", a.only.unwrap_or_default());
    }
    println!("contract: {backend}, {scale:?} shapes, seed {seed}");
    let (mut reports, mut controls) = (Vec::new(), Vec::new());
    for k in &kernels {
        let r = contract::check(k.as_ref(), scale, seed);
        println!(
            "{} {} [{}] claim: {}; reference: {}",
            if r.pass() { "PASS" } else { "FAIL" },
            r.name,
            r.backend,
            r.claim,
            r.reference
        );
        println!("    shapes: {}", r.shapes.join("; "));
        for g in &r.gates {
            println!("    {} {}: {}", if g.pass { "ok  " } else { "FAIL" }, g.name, g.detail);
        }
        for l in &r.limits {
            println!("    limits: {l}");
        }
        for c in contract::controls(k.as_ref(), scale, seed) {
            let verdict = if c.red_gates.is_empty() {
                "MISSED".to_string()
            } else {
                format!("red at {}", c.red_gates.join(", "))
            };
            println!("    control {}: {} -> {verdict}", c.fault.name, c.fault.what);
            controls.push(c);
        }
        reports.push(r);
    }
    let line = contract::summary_line(&reports, &controls);
    println!("{line}");
    let ok = reports.iter().all(|r| r.pass()) && controls.iter().all(|c| !c.red_gates.is_empty());
    Ok(if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// The kernels of `--backend` and the header's description of it.
#[cfg(feature = "contract")]
fn registry(backend: &str) -> anyhow::Result<(Vec<Box<dyn Entry>>, String)> {
    match backend {
        "cpu" => Ok((contract::registry(), format!("backend cpu, simd {:?}", tensorfold_kernels::simd::level()))),
        b if b == "cuda" || b.starts_with("cuda:") => cuda_registry(b),
        other => bail!("--backend {other}: expected cpu or cuda[:N]"),
    }
}

/// The CUDA kernels on GPU N of `cuda[:N]`.
#[cfg(all(feature = "contract", feature = "cuda"))]
fn cuda_registry(b: &str) -> anyhow::Result<(Vec<Box<dyn Entry>>, String)> {
    let ordinal = match b.strip_prefix("cuda:") {
        Some(n) => {
            n.parse::<usize>().map_err(|_| anyhow::anyhow!("--backend {b}: N in cuda:N must be a GPU number"))?
        }
        None => 0,
    };
    let be = tensorfold_kernels::CudaBackend::new(ordinal).map_err(|e| anyhow::anyhow!("--backend {b}: {e}"))?;
    let desc = format!("backend cuda, device {ordinal} {} ({})", be.device_name(), be.arch());
    Ok((contract::cuda::registry(&be), desc))
}

/// Without the `cuda` feature there are no CUDA kernels to check.
#[cfg(all(feature = "contract", not(feature = "cuda")))]
fn cuda_registry(b: &str) -> anyhow::Result<(Vec<Box<dyn Entry>>, String)> {
    bail!("--backend {b}: this build has no CUDA backend (build with `--features cuda`)")
}
