//! The kernel contract at small shapes: every kernel passes every gate and every planted control turns a gate red.

use tensorfold_contract::{Scale, check, controls, registry, summary_line};

#[test]
fn every_kernel_passes_and_every_planted_control_goes_red() {
    let seed = 20261129;
    let (mut reports, mut ctl) = (Vec::new(), Vec::new());
    for k in registry() {
        let r = check(k.as_ref(), Scale::Quick, seed);
        assert!(r.pass(), "{} failed: {:?}", r.name, r.gates);
        assert!(r.gates.iter().any(|g| g.name == "reference"), "{} has no reference gate", r.name);
        assert!(r.gates.iter().any(|g| g.name == "invariance"), "{} has no invariance gate", r.name);
        let c = controls(k.as_ref(), Scale::Quick, seed);
        assert!(!c.is_empty(), "{} plants no control", r.name);
        for control in &c {
            assert!(!control.red_gates.is_empty(), "{}: control {} was missed", control.kernel, control.fault.name);
        }
        reports.push(r);
        ctl.extend(c);
    }
    let line = summary_line(&reports, &ctl);
    assert_eq!(
        line,
        format!(
            "SUMMARY {0} kernels: {0} pass, 0 fail; {1} controls: {1} red as planted, 0 missed",
            reports.len(),
            ctl.len()
        )
    );
}

#[test]
fn the_registry_covers_every_kernel_of_the_forward() {
    let names: Vec<&str> = registry().iter().map(|k| k.name()).collect();
    for want in [
        "cpu.dot",
        "cpu.linear",
        "cpu.affine",
        "cpu.embed",
        "cpu.rmsnorm",
        "cpu.qk_norm_rope",
        "cpu.attention",
        "cpu.short_conv",
        "cpu.moe",
        "cpu.greedy",
    ] {
        assert!(names.contains(&want), "{want} is not registered");
    }
}
