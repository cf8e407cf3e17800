//! The CUDA backend (the `cuda` feature): the whole LFM2 / LFM2-MoE forward and the DSpark drafter's kernels on one
//! NVIDIA GPU, row-invariant, under the kernel contract (docs/cuda.md).
//!
//! The driver and NVRTC are loaded at run time (cudarc's dynamic loading), so this builds without a CUDA toolkit and
//! a machine without a driver or GPU gets a named [`CudaError`], never a panic. Kernel sources are the `.cu` files of
//! this folder, embedded in the binary and compiled by NVRTC at first use for the device's architecture (cached on
//! disk, `nvrtc.rs`). Every output element's reduction runs in one order fixed by its own length (a warp per dot,
//! fixed key chunks for attention), so a row's bits do not depend on the call's width or its other rows.

mod attention;
mod conv;
mod device;
pub(crate) mod draw;
mod graphs;
mod moe;
pub mod nccl;
pub mod nvrtc;
mod ops;
#[cfg(feature = "planted-faults")]
mod planted;
mod profile;
#[cfg(test)]
mod strip;
mod tc;
mod trait_impl;
mod types;

pub use nccl::NcclCollective;
pub use types::{CudaBuf, CudaConv, CudaKv, CudaMat};

pub use device::Src;
#[cfg(feature = "planted-faults")]
pub use graphs::GraphFault;
#[cfg(feature = "planted-faults")]
pub use planted::Plant;

use crate::backend::KernelError;
use cudarc::driver::CudaFunction;
use device::Dev;
use std::sync::Arc;

/// Why the CUDA backend cannot run (or a device operation failed).
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum CudaError {
    /// The driver library (`libcuda`) could not be loaded: no NVIDIA driver on this machine.
    #[error("no CUDA driver found (libcuda could not be loaded)")]
    NoDriver,
    /// The driver reports fewer devices than the ordinal asked for.
    #[error("no CUDA device {ordinal} (the driver reports {count})")]
    NoDevice {
        /// Device asked for.
        ordinal: usize,
        /// Devices present.
        count: usize,
    },
    /// The runtime compiler library (`libnvrtc`) could not be loaded, so no kernel can be built.
    #[error("no NVRTC library found (libnvrtc could not be loaded): the CUDA kernels cannot be compiled")]
    NoNvrtc,
    /// A driver call failed (a launch error, a kernel fault surfacing at a synchronization).
    #[error("CUDA driver error in {what}: {message}")]
    Driver {
        /// The call.
        what: String,
        /// The driver's error.
        message: String,
    },
    /// The collectives library (`libnccl`) could not be loaded, so several GPUs cannot work together.
    #[error("no NCCL library found (libnccl could not be loaded): expert parallelism over several GPUs needs it")]
    NoNccl,
    /// NVRTC refused a kernel source.
    #[error("NVRTC could not compile {module}.cu for {arch}: {log}")]
    Compile {
        /// Module (file stem).
        module: &'static str,
        /// Target architecture.
        arch: String,
        /// Compiler log.
        log: String,
    },
    /// The driver is out of device memory (after the pool gave its cached blocks back).
    #[error("CUDA device out of memory in {what}: {message}")]
    OutOfMemory {
        /// The call.
        what: String,
        /// The driver's error.
        message: String,
    },
    /// A failure that leaves the device or the collective unusable (a sticky driver error, a failed NCCL call).
    #[error("CUDA device lost in {what}: {message}")]
    Lost {
        /// The call.
        what: String,
        /// The driver's or NCCL's error.
        message: String,
    },
    /// A device buffer whose allocation had failed was used.
    #[error("a device buffer was used whose allocation had failed")]
    Unallocated,
    /// A call's shapes disagree (where the CPU backend would have panicked).
    #[error("shape mismatch: {0}")]
    Shape(String),
    /// A measuring setting from the environment could not be read.
    #[error("{name}={value}: expected {want}")]
    Setting {
        /// The variable.
        name: &'static str,
        /// Its value.
        value: String,
        /// What it takes.
        want: &'static str,
    },
}

impl CudaError {
    /// As a kernel's error.
    pub(crate) fn kernel(self, kernel: &'static str) -> KernelError {
        match self {
            CudaError::Lost { .. } => KernelError::DeviceLost { kernel, message: self.to_string() },
            CudaError::OutOfMemory { .. } => KernelError::DeviceOutOfMemory { kernel, message: self.to_string() },
            _ => KernelError::Device { kernel, message: self.to_string() },
        }
    }

    /// Whether the device (or the collective) is unusable after this error.
    pub fn is_lost(&self) -> bool {
        matches!(self, CudaError::Lost { .. })
    }
}

/// How a [`CudaBackend`] opens: the modes a command's flags choose (the environment mirrors them).
#[derive(Clone, Copy, Debug, Default)]
pub struct CudaOptions {
    /// The tensor-core mode (`--tensor-cores`; `TENSORFOLD_CUDA_TENSOR_CORES=1` when false): bf16 linears, MoE
    /// experts and attention on `mma.sync` with f32 activations as three bf16 pieces and f32 accumulation. Not
    /// lossy (the contract's bounds hold), but its bits differ from the CUDA-core forms', so it is the process's.
    pub tensor_cores: bool,
}

/// The CUDA backend on one device. Cloning shares the device (context, stream, compiled kernels).
#[derive(Clone)]
pub struct CudaBackend {
    pub(crate) dev: Arc<Dev>,
    /// A planted fault (the contract's controls only: feature `planted-faults`).
    #[cfg(feature = "planted-faults")]
    pub(crate) plant: Option<Plant>,
}

impl CudaBackend {
    /// Opens GPU `ordinal` with the default options (the mode from the environment). Errors: [`CudaError::NoDriver`]
    /// (no `libcuda`), [`CudaError::NoNvrtc`] (no `libnvrtc`), [`CudaError::NoDevice`], or a driver error. Nothing
    /// is compiled until a kernel is first used.
    pub fn new(ordinal: usize) -> Result<Self, CudaError> {
        Self::open(ordinal, CudaOptions::default())
    }

    /// Opens GPU `ordinal` with `opts`. Errors: as [`CudaBackend::new`], and [`CudaError::Setting`] for
    /// `tensor_cores` on a device without bf16 tensor cores.
    pub fn open(ordinal: usize, opts: CudaOptions) -> Result<Self, CudaError> {
        // A binding the driver lacks makes cudarc panic; a backend that cannot open must still be a named error.
        match std::panic::catch_unwind(|| Dev::open(ordinal, opts)) {
            Ok(r) => r.map(Self::on),
            Err(p) => {
                let msg =
                    p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()));
                Err(CudaError::Driver { what: "opening the device".into(), message: msg.unwrap_or_default() })
            }
        }
    }

    /// Compiles (or reads from the kernel cache) and loads every kernel module, so the first request does not pay
    /// NVRTC's compile (about 13 s on the H200 with an empty cache). Errors: NVRTC's or the driver's, by module.
    pub fn warm_up(&self) -> Result<(), CudaError> {
        for src in Src::ALL {
            self.dev.warm(src)?;
        }
        Ok(())
    }

    /// Whether the tensor-core mode is on for this device (the process's: [`CudaOptions::tensor_cores`]).
    pub fn tensor_cores(&self) -> bool {
        self.dev.tensor_cores()
    }

    /// The device's name (e.g. `NVIDIA H200`).
    pub fn device_name(&self) -> &str {
        &self.dev.name
    }

    /// The architecture the kernels are compiled for (e.g. `sm_90`).
    pub fn arch(&self) -> &str {
        &self.dev.arch
    }

    /// A backend on `dev`, with no planted fault.
    fn on(dev: Arc<Dev>) -> Self {
        Self {
            dev,
            #[cfg(feature = "planted-faults")]
            plant: None,
        }
    }

    /// Kernel `name` of module `src` (with the contract's planted fault when one lives in `src`).
    pub(crate) fn func(&self, src: Src, name: &str) -> Result<CudaFunction, CudaError> {
        #[cfg(feature = "planted-faults")]
        let define = self.plant.filter(|p| p.src == src).map(|p| p.define);
        #[cfg(not(feature = "planted-faults"))]
        let define = None;
        self.dev.function(src, define, name)
    }

    /// `len` f32 of uninitialized device memory.
    pub(crate) fn buf(&self, len: usize) -> Result<CudaBuf, CudaError> {
        Ok(CudaBuf { mem: self.dev.alloc(types::f32_bytes(len)?)?, len })
    }

    /// Launch limits of kernels `names` of module `src` (registers, static shared memory, local memory, threads),
    /// one line each; a kernel that cannot be loaded says why (the contract's report).
    pub fn limits(&self, src: Src, names: &[&str]) -> Vec<String> {
        names.iter().map(|n| self.dev.limits(src, n).unwrap_or_else(|e| format!("{n}: {e}"))).collect()
    }

    /// A KV cache holding `k` and `v` rows `[n, width]` (tests and the contract build stream states with it).
    pub fn kv_from_host(&self, width: usize, k: &[f32], v: &[f32]) -> Result<CudaKv, CudaError> {
        ops::expect(k.len() == v.len() && width > 0 && k.len().is_multiple_of(width), || {
            format!("KV rows of {} and {} values for width {width}", k.len(), v.len())
        })?;
        let mut kv = CudaKv::new(self.dev.clone(), width);
        kv.grow(k.len() / width)?;
        if let (Some(dk), Some(dv)) = (&kv.k, &kv.v) {
            self.dev.htod(dk.ptr, k)?;
            self.dev.htod(dv.ptr, v)?;
        }
        kv.len = k.len() / width;
        Ok(kv)
    }

    /// The held K and V rows of a cache, copied to the host.
    pub fn kv_to_host(&self, kv: &CudaKv) -> Result<(Vec<f32>, Vec<f32>), CudaError> {
        let n = kv.len * kv.width;
        let (mut k, mut v) = (vec![0f32; n], vec![0f32; n]);
        let (kp, vp) = kv.ptrs();
        if n > 0 {
            self.dev.dtoh(&mut k, kp)?;
            self.dev.dtoh(&mut v, vp)?;
        }
        Ok((k, v))
    }

    /// A conv state for `width` channels and `taps` taps holding `state` `[taps - 1, width]`.
    pub fn conv_from_host(&self, width: usize, taps: usize, state: &[f32]) -> Result<CudaConv, CudaError> {
        let c = CudaConv::new(self.dev.clone(), width, taps);
        ops::expect(state.len() == c.hist() * width, || format!("conv state of {} values", state.len()))?;
        self.dev.htod(c.state_ptr()?, state)?;
        Ok(c)
    }

    /// A conv state's rows, copied to the host.
    pub fn conv_to_host(&self, c: &CudaConv) -> Result<Vec<f32>, CudaError> {
        let mut s = vec![0f32; c.hist() * c.width];
        self.dev.dtoh(&mut s, c.state_ptr()?)?;
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opening_without_a_driver_is_a_named_error_never_a_panic() {
        match CudaBackend::new(0) {
            Ok(b) => assert!(b.arch().starts_with("sm_"), "a device opened: {}", b.device_name()),
            Err(e) => {
                let named = matches!(
                    e,
                    CudaError::NoDriver | CudaError::NoDevice { .. } | CudaError::NoNvrtc | CudaError::Driver { .. }
                );
                assert!(named, "{e}");
                assert!(!e.to_string().is_empty());
            }
        }
    }

    #[test]
    fn a_missing_device_ordinal_is_refused_by_name() {
        match CudaBackend::new(4096) {
            Ok(_) => panic!("no machine has 4097 GPUs"),
            Err(CudaError::NoDevice { ordinal, .. }) => assert_eq!(ordinal, 4096),
            Err(e) => assert!(matches!(e, CudaError::NoDriver | CudaError::NoNvrtc | CudaError::Driver { .. }), "{e}"),
        }
    }

    /// A call's error keeps its kind as a kernel error: a lost device stops the engine, out of memory is a stream's
    /// alone (503 with `Retry-After`), anything else a device error (500).
    #[test]
    fn cuda_errors_keep_their_kind_as_kernel_errors() {
        let (what, message) = ("cuMemAllocAsync".to_string(), "CUDA_ERROR_OUT_OF_MEMORY".to_string());
        let oom = CudaError::OutOfMemory { what: what.clone(), message: message.clone() }.kernel("linear");
        assert!(matches!(oom, KernelError::DeviceOutOfMemory { kernel: "linear", .. }), "{oom}");
        assert!(oom.is_out_of_memory() && oom.to_string().starts_with("OutOfMemory:"), "{oom}");
        let lost = CudaError::Lost { what: what.clone(), message: message.clone() }.kernel("linear");
        assert!(matches!(lost, KernelError::DeviceLost { .. }) && !lost.is_out_of_memory(), "{lost}");
        let other = CudaError::Driver { what, message }.kernel("linear");
        assert!(matches!(other, KernelError::Device { .. }) && !other.is_out_of_memory(), "{other}");
    }

    /// The `FAULT_...` symbols a module's source tests.
    fn faults_of(src: &str) -> Vec<String> {
        let mut v: Vec<String> = src
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|w| w.starts_with("FAULT_"))
            .map(str::to_string)
            .collect();
        v.sort();
        v.dedup();
        v
    }

    #[test]
    fn every_module_and_every_planted_fault_compiles_for_sm_90_where_nvrtc_is_present() {
        // SAFETY: only probes whether the shared library can be opened.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            eprintln!("libnvrtc not found: compile check skipped");
            return;
        }
        for src in Src::ALL {
            #[cfg_attr(not(feature = "planted-faults"), allow(unused_mut))]
            let mut builds: Vec<(Option<String>, String)> = vec![(None, src.source())];
            #[cfg(feature = "planted-faults")]
            builds.extend(faults_of(&src.planted_source()).into_iter().map(|d| (Some(d), src.planted_source())));
            for (define, text) in builds {
                let opts = nvrtc::options("sm_90", define.as_deref());
                match nvrtc::compile(src.name(), &text, "sm_90", &opts) {
                    Ok(nvrtc::Image::Cubin(b)) => assert!(!b.is_empty()),
                    Ok(nvrtc::Image::Ptx(p)) => assert!(p.contains(".entry")),
                    Err(e) => panic!("{} with {define:?}: {e}", src.name()),
                }
            }
        }
    }

    /// What production compiles names no planted fault; with the contract's feature, the planted text is the same
    /// file with its fault blocks in (stripping them gives the shipped text back, line for line).
    #[test]
    fn the_shipped_kernel_text_carries_no_planted_fault() {
        for src in Src::ALL {
            let shipped = src.source();
            assert!(faults_of(&shipped).is_empty(), "{}: {:?}", src.name(), faults_of(&shipped));
            #[cfg(feature = "planted-faults")]
            {
                let planted = src.planted_source();
                assert!(!faults_of(&planted).is_empty(), "{} plants no fault", src.name());
                assert_eq!(strip::strip_faults(&planted), shipped, "{}", src.name());
                assert_eq!(planted.lines().count(), shipped.lines().count());
                // A planted build never reads a shipped module from the kernel cache, nor the other way round.
                let define = faults_of(&planted).remove(0);
                let (plain, fault) = (nvrtc::options("sm_90", None), nvrtc::options("sm_90", Some(&define)));
                let (shipped_key, planted_key) = (
                    nvrtc::cache_key(&shipped, "sm_90", "13.0", &plain),
                    nvrtc::cache_key(&planted, "sm_90", "13.0", &fault),
                );
                assert_ne!(shipped_key, planted_key);
            }
        }
    }

    #[test]
    fn the_one_row_forms_take_calls_of_at_most_four_rows_unless_overridden() {
        use device::one_row;
        assert!(one_row(None, 1) && one_row(None, 4) && !one_row(None, 5));
        assert!(!one_row(Some(0), 1), "0 never takes them");
        assert!(one_row(Some(8), 8) && !one_row(Some(8), 9) && !one_row(Some(1), 2));
    }

    #[test]
    fn the_wide_tiles_take_calls_of_at_least_256_rows_and_32_slots_an_expert_unless_overridden() {
        use device::wide;
        assert!(!wide(None, 255, None) && wide(None, 256, None) && wide(None, 2048, None));
        // 64 experts, top-4: 512 rows fill a tile an expert on average, 256 rows half.
        assert!(wide(None, 512, Some((2048, 64))) && !wide(None, 256, Some((1024, 64))));
        assert!(!wide(None, 100, Some((10_000, 8))), "the rows count too");
        assert!(!wide(Some(0), 1, None) && !wide(Some(0), 100_000, Some((1, 1))), "0 never takes them");
        assert!(wide(Some(1), 1, None) && !wide(Some(33), 32, None) && wide(Some(33), 33, Some((33, 64))));
    }

    #[test]
    fn graphs_are_on_unless_set_to_0_and_any_other_value_is_a_named_error() {
        use device::graphs_setting;
        assert_eq!(graphs_setting(None), Ok(true));
        assert_eq!(graphs_setting(Some(" 1".into())), Ok(true));
        assert_eq!(graphs_setting(Some("0".into())), Ok(false));
        let e = graphs_setting(Some("yes".into())).unwrap_err();
        assert!(matches!(e, CudaError::Setting { name: "TENSORFOLD_CUDA_GRAPHS", .. }), "{e}");
        assert!(e.to_string().contains("TENSORFOLD_CUDA_GRAPHS=yes: expected 0"), "{e}");
        use device::part_setting;
        assert_eq!((part_setting(None), part_setting(Some("0".into()))), (Ok(64), Ok(0)));
        assert!(matches!(part_setting(Some("-1".into())), Err(CudaError::Setting { .. })));
        use device::pdl_setting;
        assert_eq!((pdl_setting(None), pdl_setting(Some("0".into()))), (Ok(true), Ok(false)));
        let e = pdl_setting(Some("on".into())).unwrap_err();
        assert!(matches!(e, CudaError::Setting { name: "TENSORFOLD_CUDA_PDL", .. }), "{e}");
    }

    #[test]
    fn tensor_cores_are_off_unless_set_to_1_on_a_device_that_has_them() {
        let tc = |v: Option<&str>, major| device::tensor_cores_setting(v.map(str::to_string), false, major);
        assert_eq!((tc(None, 9), tc(Some("0"), 9), tc(Some(" 1"), 9)), (Ok(false), Ok(false), Ok(true)));
        let e = tc(Some("1"), 7).unwrap_err();
        assert!(e.to_string().contains("no bf16 tensor cores"), "{e}");
        let e = tc(Some("yes"), 9).unwrap_err();
        assert!(matches!(e, CudaError::Setting { name: "TENSORFOLD_CUDA_TENSOR_CORES", .. }), "{e}");
        // The flag turns the mode on whatever the environment says, and is refused by its own name before sm_80.
        let flag = |v: Option<&str>, major| device::tensor_cores_setting(v.map(str::to_string), true, major);
        assert_eq!((flag(None, 9), flag(Some("0"), 8)), (Ok(true), Ok(true)));
        let e = flag(None, 7).unwrap_err();
        assert!(matches!(e, CudaError::Setting { name: "--tensor-cores", .. }), "{e}");
    }

    /// `TENSORFOLD_CUDA_ATTN_MMA`: unset and 1 on, 0 off, anything else refused by name.
    #[test]
    fn the_attention_tensor_core_setting_reads_0_and_1_only() {
        let am = device::attn_mma_setting;
        assert_eq!((am(None), am(Some("1".into())), am(Some(" 0".into()))), (Ok(true), Ok(true), Ok(false)));
        let e = am(Some("off".into())).unwrap_err();
        assert!(matches!(e, CudaError::Setting { name: "TENSORFOLD_CUDA_ATTN_MMA", .. }), "{e}");
    }

    /// Programmatic dependent launch is safe only if every kernel waits for the one before it first thing.
    #[test]
    fn every_kernel_waits_for_the_kernel_before_it_first_thing() {
        let mut entries = 0;
        for src in Src::ALL {
            let s = src.source();
            for (at, _) in s.match_indices("__global__ void") {
                let body = &s[at + s[at..].find('{').expect("a kernel has a body") + 1..];
                let first = body.trim_start_matches(|c: char| c.is_whitespace() || c == '\\');
                assert!(first.starts_with("PDL_ENTRY();"), "{}: {}", src.name(), &s[at..at + 80]);
                entries += 1;
            }
        }
        assert_eq!(entries, 41, "every entry point was checked");
    }

    #[test]
    fn every_module_source_starts_with_its_doc_line_and_the_common_header() {
        for src in Src::ALL {
            let s = src.source();
            assert!(s.starts_with("//! "), "{}", src.name());
            // The host launchers mirror these constants.
            for (name, v) in
                [("KEY_CHUNK", device::KEY_CHUNK), ("RT", device::RT), ("WPB", device::WPB), ("CT", device::CT)]
            {
                assert!(s.contains(&format!("#define {name} {v}\n")), "{name}");
            }
            assert_eq!(device::BLOCK as usize, 32 * device::WPB);
            assert!(!s.contains('\0'));
        }
        // The tiled attention's launcher mirrors these (its shared memory and its head check).
        let s = Src::Attention.source();
        for (name, v) in [("ATTN_HB", attention::TILE_HEADS), ("ATTN_TILE_HD", attention::TILE_HD)] {
            assert!(s.contains(&format!("#define {name} {v}\n")), "{name}");
        }
    }
}
