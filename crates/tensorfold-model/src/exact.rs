//! Exactness checks against a reference file (`tensorfold exact`): the engine's logits for a whole
//! prefill, a chunked prefill and token-by-token decode, each within a tolerance of the reference, and
//! the chunked and decoded logits bit-equal to the whole prefill's (row invariance). Format: docs/exact.md.

use crate::forward::{Batch, LogitRows, Model};
use safetensors::{Dtype, SafeTensors};
use tensorfold_kernels::{Backend, Segment};

/// A reference file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ReferenceError {
    /// Unreadable or not safetensors.
    #[error("reference file is not a valid safetensors file: {0}")]
    Format(String),
    /// A required tensor is absent or has the wrong dtype or rank.
    #[error("reference file: {0}")]
    Tensor(String),
    /// The reference's vocabulary disagrees with the model's.
    #[error("reference logits have {reference} columns but the model's vocabulary is {model}")]
    Vocab { reference: usize, model: usize },
}

/// A reference sequence and its logits.
pub struct Reference {
    /// Token ids `[n]`.
    pub ids: Vec<u32>,
    /// Logits `[n, vocab]`, f32.
    pub logits: Vec<f32>,
    /// Columns of `logits`.
    pub vocab: usize,
}

impl Reference {
    /// Parses `input_ids` (I64 `[n]`) and `logits` (F32 `[n, vocab]`) from safetensors bytes.
    pub fn parse(bytes: &[u8]) -> Result<Self, ReferenceError> {
        let st = SafeTensors::deserialize(bytes).map_err(|e| ReferenceError::Format(e.to_string()))?;
        let ids = st.tensor("input_ids").map_err(|_| ReferenceError::Tensor("no `input_ids` tensor".into()))?;
        let lg = st.tensor("logits").map_err(|_| ReferenceError::Tensor("no `logits` tensor".into()))?;
        if ids.dtype() != Dtype::I64 || ids.shape().len() != 1 {
            return Err(ReferenceError::Tensor(format!(
                "`input_ids` must be I64 [n], found {:?} {:?}",
                ids.dtype(),
                ids.shape()
            )));
        }
        let n = ids.shape()[0];
        if lg.dtype() != Dtype::F32 || lg.shape().len() != 2 || lg.shape()[0] != n || n == 0 {
            return Err(ReferenceError::Tensor(format!(
                "`logits` must be F32 [{n}, vocab] with n > 0, found {:?} {:?}",
                lg.dtype(),
                lg.shape()
            )));
        }
        let ids = ids
            .data()
            .chunks_exact(8)
            .map(|c| {
                u32::try_from(i64::from_le_bytes(c.try_into().expect("8 bytes")))
                    .map_err(|_| ReferenceError::Tensor("an input id is negative or too large".into()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let logits = lg.data().chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes"))).collect();
        Ok(Self { ids, logits, vocab: lg.shape()[1] })
    }
}

/// One check's outcome.
#[derive(Clone, Debug)]
pub struct Check {
    /// What was checked.
    pub name: String,
    /// Passed?
    pub pass: bool,
    /// Figures behind the verdict.
    pub detail: String,
}

/// Largest over rows of `max |engine - reference| / max |reference row|`.
pub fn max_rel_err(got: &[f32], want: &[f32], vocab: usize) -> f64 {
    got.chunks(vocab)
        .zip(want.chunks(vocab))
        .map(|(g, w)| {
            let scale = w.iter().fold(0f64, |m, v| m.max(v.abs() as f64)).max(1e-30);
            let err = g.iter().zip(w).fold(0f64, |m, (a, b)| {
                m.max(if a.is_finite() { (*a as f64 - *b as f64).abs() } else { f64::INFINITY })
            });
            err / scale
        })
        .fold(0f64, f64::max)
}

/// Logits of every position of `ids`, fed `chunk` rows per call into a fresh stream.
pub fn logits_in_chunks<B: Backend>(
    model: &Model<B>,
    ids: &[u32],
    chunk: usize,
) -> Result<Vec<f32>, crate::ForwardError> {
    let mut state = model.new_state();
    let mut all = Vec::with_capacity(ids.len() * model.cfg.vocab);
    for part in ids.chunks(chunk.max(1)) {
        let seg = Segment { first_row: 0, rows: part.len(), start_pos: state.pos, cache: 0 };
        all.extend(model.forward(Batch::new(part, &[seg], &mut [&mut state], LogitRows::All))?.logits);
    }
    Ok(all)
}

/// Runs every check of `tensorfold exact`.
pub fn run_checks<B: Backend>(model: &Model<B>, r: &Reference, tolerance: f64) -> Result<Vec<Check>, ReferenceError> {
    if r.vocab != model.cfg.vocab {
        return Err(ReferenceError::Vocab { reference: r.vocab, model: model.cfg.vocab });
    }
    let n = r.ids.len();
    let runs: [(&str, usize); 4] = [
        ("whole prefill", n),
        ("chunked prefill (7 rows a call)", 7),
        ("chunked prefill (16 rows a call)", 16),
        ("token-by-token decode", 1),
    ];
    let mut checks = Vec::new();
    let mut whole: Option<Vec<f32>> = None;
    for (name, chunk) in runs {
        let got = match logits_in_chunks(model, &r.ids, chunk) {
            Ok(g) => g,
            Err(e) => {
                checks.push(Check { name: name.into(), pass: false, detail: format!("forward failed: {e}") });
                continue;
            }
        };
        let err = max_rel_err(&got, &r.logits, r.vocab);
        checks.push(Check {
            name: format!("{name} vs reference"),
            pass: err <= tolerance,
            detail: format!("max rel err {err:.3e} (tolerance {tolerance:.1e}), {n} positions"),
        });
        match &whole {
            None => whole = Some(got),
            Some(w) => {
                let differ = w.iter().zip(&got).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
                checks.push(Check {
                    name: format!("{name} bit-equal to whole prefill"),
                    pass: differ == 0,
                    detail: format!("{differ} of {} logits differ", got.len()),
                });
            }
        }
    }
    Ok(checks)
}
