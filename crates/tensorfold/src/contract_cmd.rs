//! `tensorfold contract`: every registered kernel through its gates, then the planted controls.

use anyhow::bail;
use std::process::ExitCode;
use tensorfold_kernels::contract::{self, Scale};

/// Arguments of `tensorfold contract`.
#[derive(clap::Args)]
pub struct Args {
    /// Backend whose kernels to check.
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

/// Runs the command.
pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    if a.backend != "cpu" {
        bail!("--backend {}: this build has only the cpu backend", a.backend);
    }
    let scale = if a.quick { Scale::Quick } else { Scale::Served };
    let seed = a.seed.unwrap_or_else(contract::fresh_seed);
    let kernels: Vec<_> =
        contract::registry().into_iter().filter(|k| a.only.as_deref().is_none_or(|o| o == k.name())).collect();
    if kernels.is_empty() {
        bail!(
            "no kernel named {:?}; registered: {}",
            a.only.unwrap_or_default(),
            contract::registry().iter().map(|k| k.name()).collect::<Vec<_>>().join(", ")
        );
    }
    println!("contract: backend cpu, simd {:?}, {:?} shapes, seed {seed}", tensorfold_kernels::simd::level(), scale);
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
