//! NVRTC compilation of the embedded kernel sources for the device's architecture, with an on-disk cache of the
//! results keyed by a hash of the source, the architecture, the compiler's version and the options.

use super::CudaError;
use cudarc::nvrtc::{result, sys};
use sha2::{Digest, Sha256};
use std::ffi::CString;
use std::path::{Path, PathBuf};

/// A compiled module: machine code for the device (NVRTC compiled for a real `sm_XY`), or PTX when this NVRTC
/// gave no machine code (the driver then compiles it at load).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Image {
    /// CUBIN bytes.
    Cubin(Vec<u8>),
    /// PTX text (no trailing NUL).
    Ptx(String),
}

impl Image {
    fn extension(&self) -> &'static str {
        match self {
            Image::Cubin(_) => "cubin",
            Image::Ptx(_) => "ptx",
        }
    }

    fn bytes(&self) -> &[u8] {
        match self {
            Image::Cubin(b) => b,
            Image::Ptx(s) => s.as_bytes(),
        }
    }
}

/// The options every module is compiled with for `arch` (e.g. `sm_90`), plus `-D<define>` for a planted fault.
/// `--fmad=false`: no multiply-add is fused unless the source says `fmaf`, so the arithmetic is what the source
/// states; divisions and square roots stay IEEE-rounded (NVRTC's defaults).
pub fn options(arch: &str, define: Option<&str>) -> Vec<String> {
    let mut o = vec![format!("--gpu-architecture={arch}"), "--fmad=false".to_string(), "--std=c++17".to_string()];
    if let Some(d) = define {
        o.push(format!("-D{d}"));
    }
    o
}

/// This process's NVRTC as `MAJOR.MINOR` (`nvrtcVersion`; `unknown` when the call fails, `none` when no library
/// loads, which a device's opening has already refused). Part of every cache key: machine code from one compiler
/// release is never loaded for another (a toolkit upgrade of its major or minor version compiles afresh; a cache
/// folder shared by machines with different toolkits keeps both). A patch release reports the same version.
pub fn version() -> String {
    // SAFETY: only probes whether the shared library can be opened.
    if !unsafe { sys::is_culib_present() } {
        return "none".into();
    }
    let (mut major, mut minor) = (0, 0);
    // SAFETY: two valid out pointers for the call.
    match unsafe { sys::nvrtcVersion(&mut major, &mut minor) }.result() {
        Ok(()) => format!("{major}.{minor}"),
        Err(_) => "unknown".into(),
    }
}

/// The cache key of a module: 32 hex digits of SHA-256 over the source, the architecture, the compiler's version
/// ([`version`]) and the options, each length-prefixed so no two different inputs share a key by concatenation.
pub fn cache_key(source: &str, arch: &str, compiler: &str, options: &[String]) -> String {
    let mut h = Sha256::new();
    let parts = [source, arch, compiler].into_iter().chain(options.iter().map(|s| s.as_str()));
    for part in parts {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    h.finalize().iter().take(16).map(|b| format!("{b:02x}")).collect()
}

/// The kernel cache folder: `$XDG_CACHE_HOME/tensorfold/kernels`, else `$HOME/.cache/tensorfold/kernels`; `None`
/// when neither variable is set (then nothing is cached).
pub fn cache_dir() -> Option<PathBuf> {
    let base = match std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        Some(x) => PathBuf::from(x),
        None => PathBuf::from(std::env::var_os("HOME").filter(|v| !v.is_empty())?).join(".cache"),
    };
    Some(base.join("tensorfold").join("kernels"))
}

/// A cached image of module `name` under `key`, if one was stored.
pub fn cached(dir: &Path, name: &str, key: &str) -> Option<Image> {
    if let Ok(b) = std::fs::read(dir.join(format!("{name}-{key}.cubin"))) {
        return Some(Image::Cubin(b));
    }
    let s = std::fs::read_to_string(dir.join(format!("{name}-{key}.ptx"))).ok()?;
    // A NUL inside cannot be handed to the driver as text: treat the file as absent and compile afresh.
    (!s.contains('\0')).then_some(Image::Ptx(s))
}

/// Stores an image (written to a temporary name, then renamed, so a reader never sees half a file). Failures are
/// ignored: the cache only saves compile time.
pub fn store(dir: &Path, name: &str, key: &str, image: &Image) {
    let file = dir.join(format!("{name}-{key}.{}", image.extension()));
    let tmp = dir.join(format!(".{name}-{key}.{}.tmp", std::process::id()));
    let ok = std::fs::create_dir_all(dir).is_ok() && std::fs::write(&tmp, image.bytes()).is_ok();
    if !ok || std::fs::rename(&tmp, &file).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

/// Compiles `source` (module `name`) with `options`. Errors: [`CudaError::NoNvrtc`] when the library cannot be
/// loaded, [`CudaError::Compile`] with NVRTC's log.
pub fn compile(name: &'static str, source: &str, arch: &str, options: &[String]) -> Result<Image, CudaError> {
    // SAFETY: only probes whether the shared library can be opened.
    if !unsafe { sys::is_culib_present() } {
        return Err(CudaError::NoNvrtc);
    }
    let fail = |log: String| CudaError::Compile { module: name, arch: arch.to_string(), log };
    let src = CString::new(source).map_err(|_| fail("the source holds a NUL byte".into()))?;
    let cname = CString::new(format!("{name}.cu")).map_err(|_| fail("bad module name".into()))?;
    let prog = result::create_program(&src, Some(cname.as_c_str())).map_err(|e| fail(format!("{e:?}")))?;
    // SAFETY: `prog` was just created and is destroyed exactly once below.
    let out = unsafe { compile_program(prog, options) };
    // SAFETY: as above; `src` and `cname` outlive the program.
    let _ = unsafe { result::destroy_program(prog) };
    out.map_err(fail)
}

/// Compiles an existing program and extracts its CUBIN (or PTX). Errors carry the compile log.
///
/// # Safety
/// `prog` must be a live program from `create_program`.
unsafe fn compile_program(prog: sys::nvrtcProgram, options: &[String]) -> Result<Image, String> {
    // SAFETY: forwarded to the caller.
    if let Err(e) = unsafe { result::compile_program(prog, options) } {
        // SAFETY: as above.
        let log = unsafe { result::get_program_log(prog) }.map(c_text).unwrap_or_default();
        return Err(format!("{e:?}: {log}"));
    }
    let mut size = 0usize;
    // SAFETY: as above; `size` is a valid out pointer.
    unsafe { sys::nvrtcGetCUBINSize(prog, &mut size) }.result().map_err(|e| format!("{e:?}"))?;
    if size > 0 {
        let mut cubin = vec![0u8; size];
        // SAFETY: `cubin` holds the `size` bytes NVRTC reported.
        unsafe { sys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr().cast()) }.result().map_err(|e| format!("{e:?}"))?;
        return Ok(Image::Cubin(cubin));
    }
    // SAFETY: as above.
    let ptx = unsafe { result::get_ptx(prog) }.map_err(|e| format!("{e:?}"))?;
    Ok(Image::Ptx(c_text(ptx)))
}

/// NUL-terminated C characters as a String (lossy), without the terminator.
fn c_text(chars: Vec<std::ffi::c_char>) -> String {
    let bytes: Vec<u8> = chars.into_iter().map(|c| c as u8).take_while(|&b| b != 0).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_key_is_stable_and_covers_source_arch_compiler_and_options() {
        let o = options("sm_90", None);
        let src = "extern \"C\" __global__ void f() {}";
        let k = cache_key(src, "sm_90", "13.0", &o);
        assert_eq!(k.len(), 32);
        assert!(k.chars().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(k, cache_key(src, "sm_90", "13.0", &o));
        assert_ne!(k, cache_key("extern \"C\" __global__ void g() {}", "sm_90", "13.0", &o));
        assert_ne!(k, cache_key(src, "sm_80", "13.0", &o));
        // Another NVRTC never loads this one's machine code.
        assert_ne!(k, cache_key(src, "sm_90", "12.9", &o));
        let planted = options("sm_90", Some("FAULT_X"));
        assert_ne!(k, cache_key(src, "sm_90", "13.0", &planted));
        // Length prefixes: moving a character between parts changes the key.
        assert_ne!(cache_key("ab", "c", "", &[]), cache_key("a", "bc", "", &[]));
        assert_ne!(cache_key("a", "b", "c1", &[]), cache_key("a", "bc", "1", &[]));
    }

    #[test]
    fn options_name_the_architecture_and_keep_multiply_add_unfused() {
        let o = options("sm_90", Some("FAULT_X"));
        assert!(o.contains(&"--gpu-architecture=sm_90".to_string()));
        assert!(o.contains(&"--fmad=false".to_string()));
        assert!(o.contains(&"-DFAULT_X".to_string()));
    }

    #[test]
    fn the_cache_stores_and_finds_an_image() {
        let dir = std::env::temp_dir().join(format!("tensorfold-kernel-cache-test-{}", std::process::id()));
        let img = Image::Cubin(vec![1, 2, 3]);
        store(&dir, "rows", "abc", &img);
        assert_eq!(cached(&dir, "rows", "abc"), Some(img));
        assert_eq!(cached(&dir, "rows", "abd"), None);
        store(&dir, "conv", "k", &Image::Ptx("// ptx".into()));
        assert_eq!(cached(&dir, "conv", "k"), Some(Image::Ptx("// ptx".into())));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
