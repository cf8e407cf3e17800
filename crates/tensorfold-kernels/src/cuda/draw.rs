//! The keyed draw's launcher (sample.cu): each row's parameters packed for the device, the ids copied back, a
//! nucleus longer than the device's window drawn on the host from that row alone.

use super::device::{Arg, Src};
use super::ops::{int, mul};
use super::types::CudaBuf;
use super::{CudaBackend, CudaError};
use crate::sample::{DrawSpec, SampleError, SamplingParams, draw};

/// Threads of the draw kernel's block (sample.cu's `DRAW_THREADS`, sample.rs's `DRAW_LANES`).
pub(crate) const DRAW_THREADS: u32 = 1024;
const _: () = assert!(DRAW_THREADS as usize == crate::sample::DRAW_LANES);

/// sample.cu's statuses.
const DRAW_OK: u32 = 0;
const DRAW_NONFINITE: u32 = 1;
const DRAW_HOST: u32 = 2;

/// The four words of a row's spec: seed, position, temperature bits | top_k << 32, top_p bits | min_p bits << 32.
/// Top-k saturates at `u32::MAX` (past any vocabulary: off).
fn pack(p: &SamplingParams, position: u64) -> [u64; 4] {
    let k = u64::from(u32::try_from(p.top_k).unwrap_or(u32::MAX));
    [
        p.seed,
        position,
        u64::from(p.temperature.to_bits()) | (k << 32),
        u64::from(p.top_p.to_bits()) | (u64::from(p.min_p.to_bits()) << 32),
    ]
}

/// Each row's draw and how many rows the host drew (their nucleus was longer than the device's window).
pub(crate) type Drawn = (Vec<Result<u32, SampleError>>, usize);

/// The keyed draw of each row of `logits` (`[specs.len(), vocab]`). A row whose parameters are refused gets its
/// [`SampleError::InvalidParam`] and is drawn greedily on the device (the result is dropped).
pub(crate) fn draw_rows(
    be: &CudaBackend,
    logits: &CudaBuf,
    vocab: usize,
    specs: &[DrawSpec],
) -> Result<Drawn, CudaError> {
    let rows = specs.len();
    if rows == 0 {
        return Ok((Vec::new(), 0));
    }
    if vocab == 0 {
        return Ok((vec![Err(SampleError::EmptyLogits); rows], 0));
    }
    let out = be.dev.alloc(mul(rows, 12)?)?.ok_or(CudaError::Unallocated)?;
    let checked = launch(be, logits, vocab, specs, out.ptr)?;
    let mut host = vec![0u32; rows * 3];
    be.dev.dtoh(&mut host, out.ptr)?;
    let (mut drawn, mut on_host) = (Vec::with_capacity(rows), 0);
    for (r, (o, ok)) in host.chunks_exact(3).zip(checked).enumerate() {
        drawn.push(match (ok, o[1]) {
            (Err(e), _) => Err(e),
            (Ok(()), DRAW_OK) => Ok(o[0]),
            (Ok(()), DRAW_NONFINITE) => Err(SampleError::NonFinite { index: o[2] as usize }),
            (Ok(()), DRAW_HOST) => {
                on_host += 1;
                host_row(be, logits, vocab, r, &specs[r])?
            }
            (Ok(()), s) => return Err(CudaError::Shape(format!("draw_rows returned status {s} for row {r}"))),
        });
    }
    Ok((drawn, on_host))
}

/// Validates each spec (a refused one is drawn greedily, its error kept for the caller), packs the specs and launches
/// `draw_rows` writing `[token, status, index]` a row at `out`.
fn launch(
    be: &CudaBackend,
    logits: &CudaBuf,
    vocab: usize,
    specs: &[DrawSpec],
    out: u64,
) -> Result<Vec<Result<(), SampleError>>, CudaError> {
    let rows = specs.len();
    if logits.len() != mul(rows, vocab)? || vocab == 0 {
        return Err(CudaError::Shape(format!("{} logits for {rows} rows of {vocab}", logits.len())));
    }
    let checked: Vec<Result<(), SampleError>> = specs.iter().map(|s| s.params.validate()).collect();
    let words: Vec<u64> = specs
        .iter()
        .zip(&checked)
        .flat_map(|(s, ok)| match ok {
            Ok(()) => pack(&s.params, s.position),
            Err(_) => pack(&SamplingParams::greedy(), s.position),
        })
        .collect();
    let spec = be.dev.upload(&words)?.ok_or(CudaError::Unallocated)?;
    let f = be.func(Src::Sample, "draw_rows")?;
    let args = [Arg::P(logits.ptr()?), Arg::I(int(vocab, "vocab")?), Arg::P(spec.ptr), Arg::P(out)];
    be.dev.launch(&f, (int(rows, "rows")? as u32, 1, 1), DRAW_THREADS, 0, &args)?;
    Ok(checked)
}

/// The draws kept on the device: `out` (`[rows, 3]` u32 words in an f32 buffer's bits) gets each row's token,
/// status (0 drawn, or a refused spec's greedy pick; 1 a non-finite logit; 2 a nucleus past the window, token = the
/// greedy pick) and first non-finite index. Nothing is read back.
pub(crate) fn draw_into(
    be: &CudaBackend,
    logits: &CudaBuf,
    vocab: usize,
    specs: &[DrawSpec],
    out: &mut CudaBuf,
) -> Result<(), CudaError> {
    if out.len() != mul(specs.len(), 3)? {
        return Err(CudaError::Shape(format!("draw_into: {} words for {} rows", out.len(), specs.len())));
    }
    if specs.is_empty() {
        return Ok(());
    }
    launch(be, logits, vocab, specs, out.ptr()?).map(|_| ())
}

/// Row `r` drawn on the host (a nucleus past the device's window): only that row is copied.
fn host_row(
    be: &CudaBackend,
    logits: &CudaBuf,
    vocab: usize,
    r: usize,
    s: &DrawSpec,
) -> Result<Result<u32, SampleError>, CudaError> {
    let mut row = vec![0f32; vocab];
    be.dev.dtoh(&mut row, logits.ptr()? + (r * vocab * 4) as u64)?;
    Ok(draw(&s.params, s.position, &row))
}
