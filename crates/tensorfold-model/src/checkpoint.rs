//! Checkpoint files: a Hugging Face model directory (or an embedded copy), memory-mapped safetensors
//! (one file or shards with `model.safetensors.index.json`), and the tensor table they hold.

use memmap2::Mmap;
use safetensors::{Dtype as StDtype, SafeTensors};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tensorfold_kernels::HostBytes;

/// A checkpoint file that could not be read. Each variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// The model directory does not exist or is not a directory.
    #[error("model directory {0} does not exist or is not a directory")]
    NoDir(PathBuf),
    /// A required file is absent.
    #[error("{file} is missing from {dir}")]
    Missing { dir: String, file: String },
    /// An I/O error on a named file.
    #[error("cannot read {path}: {source}")]
    Io { path: String, source: std::io::Error },
    /// A safetensors file is truncated or corrupt (header, offsets or length disagree).
    #[error("{file} is not a valid safetensors file (truncated or corrupt?): {message}")]
    Safetensors { file: String, message: String },
    /// The shard index is unreadable or malformed (a shard it names that is absent is `Missing`).
    #[error("model.safetensors.index.json is invalid: {0}")]
    Index(String),
    /// Two files hold a tensor of the same name.
    #[error("tensor {0} appears in more than one weights file")]
    Duplicate(String),
    /// The shard index and the shards' own headers disagree about where a tensor lives.
    #[error("model.safetensors.index.json places tensor {tensor} in {index}, but {found}")]
    IndexMismatch { tensor: String, index: String, found: String },
    /// A tensor dtype we cannot run.
    #[error("tensor {name} has dtype {dtype}; supported are BF16, F16, F32 and U32 (MLX codes)")]
    Dtype { name: String, dtype: String },
    /// A synthetic checkpoint's spec is refused (unknown shape, bad seed, config refused).
    #[error("synthetic checkpoint: {0}")]
    Synthetic(String),
}

/// Where a checkpoint's files come from.
#[derive(Clone, Debug)]
pub enum Source {
    /// A Hugging Face model directory.
    Dir(PathBuf),
    /// Files compiled into the binary: `(file name, bytes)`.
    Embedded(&'static [(&'static str, &'static [u8])]),
    /// A config with seeded random weights made in memory (`crate::synthetic`); it has no tokenizer.
    Synthetic(Arc<crate::synthetic::Synthetic>),
}

impl Source {
    /// A short description for logs and errors.
    pub fn describe(&self) -> String {
        match self {
            Source::Dir(p) => p.display().to_string(),
            Source::Embedded(_) => "<embedded default model>".into(),
            Source::Synthetic(s) => s.name.clone(),
        }
    }

    /// Reads a small file whole; `Ok(None)` when it does not exist.
    pub fn read(&self, name: &str) -> Result<Option<Vec<u8>>, CheckpointError> {
        match self {
            Source::Dir(d) => {
                let p = d.join(name);
                match std::fs::read(&p) {
                    Ok(b) => Ok(Some(b)),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                    Err(source) => Err(CheckpointError::Io { path: p.display().to_string(), source }),
                }
            }
            Source::Embedded(files) => Ok(files.iter().find(|(n, _)| *n == name).map(|(_, b)| b.to_vec())),
            Source::Synthetic(s) => Ok((name == "config.json").then(|| s.config.clone())),
        }
    }

    /// Maps a large file (zero-copy); `Ok(None)` when it does not exist.
    fn map(&self, name: &str) -> Result<Option<Arc<dyn AsRef<[u8]> + Send + Sync>>, CheckpointError> {
        match self {
            Source::Dir(d) => {
                let p = d.join(name);
                let f = match std::fs::File::open(&p) {
                    Ok(f) => f,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                    Err(source) => return Err(CheckpointError::Io { path: p.display().to_string(), source }),
                };
                // SAFETY: the file is opened read-only; like every mmap-based loader we assume it is not
                // truncated by another process while mapped.
                let m = unsafe { Mmap::map(&f) }
                    .map_err(|source| CheckpointError::Io { path: p.display().to_string(), source })?;
                Ok(Some(Arc::new(m)))
            }
            Source::Embedded(files) => Ok(files.iter().find(|(n, _)| *n == name).map(|(_, b)| {
                let a: Arc<dyn AsRef<[u8]> + Send + Sync> = Arc::new(*b);
                a
            })),
            Source::Synthetic(_) => Ok(None),
        }
    }
}

/// Element type of a stored tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoredDtype {
    /// bfloat16.
    Bf16,
    /// IEEE half (widened to f32 at load; exact).
    F16,
    /// IEEE single.
    F32,
    /// Unsigned 32-bit words: MLX affine codes (a quantized module's `weight`, beside its `scales` and `biases`).
    U32,
}

impl StoredDtype {
    /// The safetensors name.
    pub fn as_str(self) -> &'static str {
        match self {
            StoredDtype::Bf16 => "BF16",
            StoredDtype::F16 => "F16",
            StoredDtype::F32 => "F32",
            StoredDtype::U32 => "U32",
        }
    }
}

/// One tensor of the checkpoint: dtype, shape, and its bytes (zero-copy into the mapped file).
#[derive(Clone, Debug)]
pub struct TensorEntry {
    /// Stored dtype.
    pub dtype: StoredDtype,
    /// Shape, outermost first.
    pub shape: Vec<usize>,
    /// Raw little-endian bytes.
    pub bytes: HostBytes,
}

/// Every tensor of a checkpoint by name, plus the files they came from.
#[derive(Debug, Default)]
pub struct TensorTable {
    /// Tensors by name.
    pub tensors: BTreeMap<String, TensorEntry>,
    /// Weight files read.
    pub files: Vec<String>,
}

impl TensorTable {
    /// Opens `model.safetensors`, or the shards listed in `model.safetensors.index.json`.
    pub fn open(src: &Source) -> Result<Self, CheckpointError> {
        if let Source::Synthetic(s) = src {
            let cfg = crate::config::ModelConfig::parse(&s.config)
                .map_err(|e| CheckpointError::Synthetic(format!("{}: {e}", s.name)))?;
            return s.table(&cfg);
        }
        let index = match src.read("model.safetensors.index.json")? {
            Some(idx) => Some(weight_map(&idx)?),
            None => None,
        };
        let files = index.as_ref().map_or_else(|| Ok(vec!["model.safetensors".to_string()]), shard_files)?;
        let mut table = TensorTable::default();
        let mut origin = std::collections::BTreeMap::new();
        for f in &files {
            let data = src.map(f)?.ok_or_else(|| CheckpointError::Missing { dir: src.describe(), file: f.clone() })?;
            for name in table.add_file(f, data)? {
                origin.insert(name, f.clone());
            }
        }
        if let Some(map) = &index {
            check_index(map, &origin)?;
        }
        table.files = files;
        Ok(table)
    }

    /// Adds a file's tensors; returns their names.
    fn add_file(
        &mut self,
        file: &str,
        data: Arc<dyn AsRef<[u8]> + Send + Sync>,
    ) -> Result<Vec<String>, CheckpointError> {
        let mut names = Vec::new();
        let buf: &[u8] = (*data).as_ref();
        let st = SafeTensors::deserialize(buf)
            .map_err(|e| CheckpointError::Safetensors { file: file.to_string(), message: e.to_string() })?;
        for (name, view) in st.tensors() {
            let dtype = match view.dtype() {
                StDtype::BF16 => StoredDtype::Bf16,
                StDtype::F16 => StoredDtype::F16,
                StDtype::F32 => StoredDtype::F32,
                StDtype::U32 => StoredDtype::U32,
                other => return Err(CheckpointError::Dtype { name, dtype: format!("{other:?}") }),
            };
            let start = view.data().as_ptr() as usize - buf.as_ptr() as usize;
            let bytes =
                HostBytes::new(data.clone(), start, view.data().len()).ok_or_else(|| CheckpointError::Safetensors {
                    file: file.to_string(),
                    message: format!("tensor {name} lies outside the file"),
                })?;
            let entry = TensorEntry { dtype, shape: view.shape().to_vec(), bytes };
            if self.tensors.insert(name.clone(), entry).is_some() {
                return Err(CheckpointError::Duplicate(name));
            }
            names.push(name);
        }
        Ok(names)
    }

    /// Total bytes of all tensors.
    pub fn total_bytes(&self) -> usize {
        self.tensors.values().map(|t| t.bytes.len()).sum()
    }
}

/// The index's `weight_map` object.
fn weight_map(idx: &[u8]) -> Result<serde_json::Map<String, serde_json::Value>, CheckpointError> {
    let v: serde_json::Value = serde_json::from_slice(idx).map_err(|e| CheckpointError::Index(e.to_string()))?;
    match v.get("weight_map") {
        Some(serde_json::Value::Object(m)) => Ok(m.clone()),
        _ => Err(CheckpointError::Index("no weight_map object".into())),
    }
}

/// Every tensor the index lists lives in the shard it names, and every tensor of the shards is listed (the index
/// is what transformers loads by, so a disagreement means the files are not the checkpoint the index describes).
fn check_index(
    map: &serde_json::Map<String, serde_json::Value>,
    origin: &std::collections::BTreeMap<String, String>,
) -> Result<(), CheckpointError> {
    for (tensor, file) in map {
        let index = file.as_str().unwrap_or_default().to_string();
        match origin.get(tensor) {
            Some(f) if *f == index => {}
            Some(f) => return Err(mismatch(tensor, index, format!("{f} holds it"))),
            None => return Err(mismatch(tensor, index, "no shard holds it".into())),
        }
    }
    match origin.iter().find(|(t, _)| !map.contains_key(*t)) {
        Some((t, f)) => Err(mismatch(t, "no shard (it is not listed)".into(), format!("{f} holds it"))),
        None => Ok(()),
    }
}

fn mismatch(tensor: &str, index: String, found: String) -> CheckpointError {
    CheckpointError::IndexMismatch { tensor: tensor.to_string(), index, found }
}

/// The distinct shard files of an index, in first-seen order; names must be plain file names.
fn shard_files(map: &serde_json::Map<String, serde_json::Value>) -> Result<Vec<String>, CheckpointError> {
    let mut seen = BTreeSet::new();
    let mut files = Vec::new();
    for f in map.values() {
        let f = f.as_str().ok_or_else(|| CheckpointError::Index("weight_map values must be file names".into()))?;
        if Path::new(f).components().count() != 1 || f.starts_with('.') {
            return Err(CheckpointError::Index(format!("shard name {f:?} is not a plain file name")));
        }
        if seen.insert(f.to_string()) {
            files.push(f.to_string());
        }
    }
    if files.is_empty() {
        return Err(CheckpointError::Index("weight_map is empty".into()));
    }
    Ok(files)
}
