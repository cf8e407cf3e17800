//! Writes the shipped kernel text: each `.cu` module of `src/cuda/` with its planted-fault blocks stripped
//! (`src/cuda/strip.rs`), into `$OUT_DIR/shipped/`, where `cuda/device.rs` embeds it from.

#[path = "src/cuda/strip.rs"]
#[allow(dead_code)]
mod strip;

use std::path::PathBuf;

const MODULES: [&str; 7] = ["rows", "dense", "rope", "attention", "conv", "moe", "sample"];

fn main() {
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR")).join("shipped");
    std::fs::create_dir_all(&out).expect("create $OUT_DIR/shipped");
    println!("cargo:rerun-if-changed=src/cuda/strip.rs");
    for m in MODULES {
        let path = format!("src/cuda/{m}.cu");
        println!("cargo:rerun-if-changed={path}");
        let mut text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        // The tensor-core linears (narrow and few-row, then wide) share dense.cu's module (and its helpers), the
        // tiled and tensor-core attention attention.cu's.
        let parts: &[&str] = match m {
            "dense" => &["src/cuda/dense_tc.cu", "src/cuda/dense_tcw.cu"],
            "attention" => &["src/cuda/attention_tiled.cu", "src/cuda/attention_mma.cu"],
            _ => &[],
        };
        for part in parts {
            println!("cargo:rerun-if-changed={part}");
            text.push('\n');
            text.push_str(&std::fs::read_to_string(part).unwrap_or_else(|e| panic!("{part}: {e}")));
        }
        std::fs::write(out.join(format!("{m}.cu")), strip::strip_faults(&text)).expect("write the shipped source");
    }
}
