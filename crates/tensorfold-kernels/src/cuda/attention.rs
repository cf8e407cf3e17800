//! Launchers of the attention kernels: K/V appends that grow each stream's cache, causal GQA attention over each
//! stream's keys, and the drafter's non-causal block attention; one kernel pair a layer for all the call's streams.
//! The checks (shapes, segment table, key counts) are the CPU's and run before any cache changes.

use super::device::{ATTN_TILE, Arg, BLOCK, GRID_YZ, KEY_CHUNK, Src, WPB};
use super::ops::{blocks, int, mul};
use super::types::{CudaBuf, CudaKv, f32_bytes};
use super::{CudaBackend, CudaError};
use crate::backend::{KernelError, Segment};
use crate::shape::{check_cache_state, check_caches, check_len, row_positions};

/// Threads of a tensor-core block (attention_mma.cu's `AM_WARPS` warps).
const MMA_THREADS: u32 = 128;

/// Scratch floats one launch of the partial kernel may fill (256 MiB): a call whose rows need more is split into
/// launches of fewer rows, which changes no row's arithmetic.
pub(crate) const SCRATCH_FLOATS: usize = 1 << 26;

/// Largest head_dim: the partial kernel keeps the query head and two chunk-sized arrays in shared memory.
const MAX_HEAD_DIM: usize = 4096;

/// Largest head_dim of the tiled form (attention.cu's `ATTN_TILE_HD`; a key chunk's K and V in shared memory).
pub(crate) const TILE_HD: usize = 64;

/// Query heads a warp of the tiled form takes at once (attention.cu's `ATTN_HB`).
pub(crate) const TILE_HEADS: usize = 4;

/// Largest head_dim of the tensor-core form (attention_mma.cu's `AM_HD`), which also needs head_dim % 8 == 0.
pub(crate) const MMA_HD: usize = 64;

/// (row, query head) pairs a block of the tensor-core form holds (attention_mma.cu's `AM_M`): a tile has
/// `MMA_PAIRS / group` rows.
pub(crate) const MMA_PAIRS: usize = 64;

/// Keys of one of the tensor-core form's sub-blocks (attention_mma.cu's `AM_SUB`).
const MMA_SUB: usize = 64;

/// The rows of a call as the attention kernels read them: `desc` (4 words a row, attention.cu's RowKv), each row's
/// key count, and `tiles`, each segment's rows in runs of at most the form's tile (first row, rows): rows that share
/// every key, which the tiled and tensor-core forms read once for all of them.
struct Rows<'a> {
    desc: &'a [u64],
    keys: &'a [usize],
    tiles: Vec<(usize, usize)>,
    /// Rows of the call's largest segment (the tiled form runs from [`ATTN_TILE`] of them).
    widest: usize,
}

impl<'a> Rows<'a> {
    /// `tile`: the form's rows a tile ([`ATTN_TILE`], or [`MMA_PAIRS`] / group on the tensor cores).
    fn new(desc: &'a [u64], keys: &'a [usize], segs: &[Segment], tile: usize) -> Self {
        let tile = tile.max(1);
        let tiles = segs
            .iter()
            .flat_map(|s| (0..s.rows).step_by(tile).map(move |i| (s.first_row + i, tile.min(s.rows - i))))
            .collect();
        Rows { desc, keys, tiles, widest: segs.iter().map(|s| s.rows).max().unwrap_or(0) }
    }

    /// The tiles cut to the launch's rows `[a, b)`, as words: low 32 bits the first row, high 32 the rows.
    fn cut(&self, a: usize, b: usize) -> impl Iterator<Item = u64> + '_ {
        self.tiles.iter().filter_map(move |&(f, n)| {
            let (lo, hi) = (f.max(a), (f + n).min(b));
            // Lazily: `hi - lo` underflows for a tile outside the launch.
            if hi > lo { Some(lo as u64 | (((hi - lo) as u64) << 32)) } else { None }
        })
    }

    /// [`Rows::cut`] split by form: the words of tiles of two rows or more, for attn_tiled, and the rows of the
    /// one-row ones, for attn_partial.
    fn tile_words(&self, a: usize, b: usize) -> (Vec<u64>, Vec<u64>) {
        let (tiles, singles): (Vec<u64>, Vec<u64>) = self.cut(a, b).partition(|w| w >> 32 > 1);
        (tiles, singles.into_iter().map(|w| w & 0xffff_ffff).collect())
    }
}

/// Shared memory of a tiled block in bytes: the chunk's K rows (padded by 1) and V rows, and each warp's query
/// heads and probabilities (attention.cu's `attn_tiled`).
fn tile_smem(hd: usize) -> usize {
    4 * (KEY_CHUNK * (hd + 1) + KEY_CHUNK * hd + WPB * TILE_HEADS * (hd + KEY_CHUNK))
}

/// Shared memory of a tensor-core block in bytes: three pieces of a sub-block's K rows and of its V columns, each
/// row padded by 4 words, each lane's query fragments, and a decode tile's shared scores and probabilities (a
/// sub-block's 4 words a key group a lane, twice: attention_mma.cu's `attn_mma`, `attn_mma_few_body`).
fn mma_smem(hd: usize) -> usize {
    let hdp = hd.next_multiple_of(16);
    let pieces = 3 * (MMA_SUB * (hdp / 2 + 4) + hdp * (MMA_SUB / 2 + 4) + MMA_THREADS as usize * (hdp / 16) * 4);
    4 * (pieces + 2 * (MMA_SUB / 8) * 4 * 32)
}

/// Whether a call of `(hd, group)` runs on the tensor cores (the mode is on), refusing by name, in the mode, a
/// shape the tensor-core form cannot serve: no other reduction order stands in for it.
fn mma_form(be: &CudaBackend, kernel: &'static str, hd: usize, group: usize) -> Result<bool, KernelError> {
    if !be.dev.attn_mma() {
        return Ok(false);
    }
    mma_shape(kernel, hd, group).map(|()| true)
}

/// The shapes the tensor-core form serves: head_dim a multiple of 8 up to [`MMA_HD`], at most [`MMA_PAIRS`] query
/// heads a KV head.
fn mma_shape(kernel: &'static str, hd: usize, group: usize) -> Result<(), KernelError> {
    let refuse = |what, got, want| Err(KernelError::Shape { kernel, what, got, want });
    if !hd.is_multiple_of(8) {
        return refuse("head_dim on the tensor cores (a multiple of 8)", hd, 8);
    }
    if hd > MMA_HD {
        return refuse("head_dim on the tensor cores (at most)", hd, MMA_HD);
    }
    if group > MMA_PAIRS {
        return refuse("query heads per KV head on the tensor cores", group, MMA_PAIRS);
    }
    Ok(())
}

/// What open checks of a model's attention (`Backend::check_attention`): the geometry every form needs, then, in the
/// tensor-core mode, the tensor-core form's shapes.
pub(crate) fn check_shape(be: &CudaBackend, heads: usize, kv_heads: usize, hd: usize) -> Result<(), KernelError> {
    let width = kv_heads.saturating_mul(hd);
    let (hd, group) = geometry("attention", heads, kv_heads, width)?;
    mma_form(be, "attention", hd, group).map(drop)
}

/// The rows of a tile of the form `mma` names (see [`mma_form`]).
fn tile_rows(mma: bool, group: usize) -> usize {
    if mma { MMA_PAIRS / group.max(1) } else { ATTN_TILE }
}

/// `(head_dim, query heads per KV head)` of a call, refusing shapes GQA cannot map.
fn geometry(kernel: &'static str, heads: usize, kv_heads: usize, width: usize) -> Result<(usize, usize), KernelError> {
    let ok = kv_heads > 0
        && heads > 0
        && heads <= GRID_YZ
        && width.is_multiple_of(kv_heads)
        && heads.is_multiple_of(kv_heads)
        && (1..=MAX_HEAD_DIM).contains(&(width / kv_heads));
    if !ok {
        return Err(KernelError::Shape {
            kernel,
            what: "heads (a multiple of kv_heads) and cache width",
            got: heads,
            want: kv_heads,
        });
    }
    Ok((width / kv_heads, heads / kv_heads))
}

fn u32_of(v: usize, what: &str) -> Result<u64, KernelError> {
    u32::try_from(v).map(u64::from).map_err(|_| KernelError::Segments(format!("{what} {v} is past 2^32")))
}

/// Appends each segment's K/V rows to its cache, then causal attention of every row over its stream's keys `[0, pos]`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention(
    be: &CudaBackend,
    q: &CudaBuf,
    k: &CudaBuf,
    v: &CudaBuf,
    heads: usize,
    kv_heads: usize,
    segs: &[Segment],
    caches: &mut [&mut CudaKv],
    out: &mut CudaBuf,
) -> Result<(), KernelError> {
    check_caches(segs, caches.len())?;
    if segs.is_empty() && q.is_empty() && k.is_empty() && v.is_empty() && out.is_empty() {
        return Ok(());
    }
    let width = caches.first().map_or(0, |c| c.width);
    let (hd, group) = geometry("attention", heads, kv_heads, width)?;
    let n_rows = k.len() / width;
    check_len("attention", "k", k.len(), n_rows * width)?;
    check_len("attention", "q", q.len(), n_rows * heads * hd)?;
    check_len("attention", "v", v.len(), n_rows * width)?;
    check_len("attention", "out", out.len(), n_rows * heads * hd)?;
    let pos = row_positions(segs, n_rows)?;
    check_cache_state("attention", segs, width, |i| (caches[i].width, caches[i].len))?;
    let keys: Vec<usize> = pos.iter().map(|p| p + 1).collect();
    for &k in &keys {
        u32_of(k, "key count")?;
    }
    let dims = (heads, group, hd, width);
    let mma = mma_form(be, "attention", hd, group)?;
    if !be.dev.fused {
        // The measuring aid's form: append first (its own launch), then every key from the cache.
        append(be, k, v, segs, caches).map_err(|e| e.kernel("attention"))?;
        let desc = causal_desc(segs, caches, n_rows, false);
        let rows = Rows::new(&desc, &keys, segs, tile_rows(mma, group));
        return run(be, (q, k, v), dims, &rows, mma, None, out).map_err(|e| e.kernel("attention"));
    }
    // A row reads its segment's earlier rows and itself from k/v, and attn_combine appends it to the cache.
    reserve(segs, caches).map_err(|e| e.kernel("attention"))?;
    let desc = causal_desc(segs, caches, n_rows, true);
    let rows = Rows::new(&desc, &keys, segs, tile_rows(mma, group));
    let r = run(be, (q, k, v), dims, &rows, mma, Some(width), out).map_err(|e| e.kernel("attention"));
    for s in segs {
        caches[s.cache].len += s.rows;
    }
    r
}

/// The causal rows' descriptors (attention.cu's RowKv; cache addresses read after any growth, which moves a
/// cache): a row sees its cache's rows, and with `own` its segment's call rows up to itself (else every key is
/// in the cache, appended first).
fn causal_desc(segs: &[Segment], caches: &[&mut CudaKv], n_rows: usize, own: bool) -> Vec<u64> {
    let mut desc = vec![0u64; 4 * n_rows];
    for s in segs {
        let (kp, vp) = caches[s.cache].ptrs();
        for (i, r) in (s.first_row..s.first_row + s.rows).enumerate() {
            let (held, mine) = if own { (s.start_pos, i + 1) } else { (s.start_pos + i + 1, 0) };
            desc[4 * r..4 * r + 4].copy_from_slice(&[kp, vp, held as u64 | ((mine as u64) << 32), s.first_row as u64]);
        }
    }
    desc
}

/// Grows the named caches to hold the call's rows (amortized doubling, as a Vec); their lengths stay.
fn reserve(segs: &[Segment], caches: &mut [&mut CudaKv]) -> Result<(), CudaError> {
    for s in segs {
        let c = &mut caches[s.cache];
        let need = c.len + s.rows;
        if need > c.cap {
            c.grow(need.max(2 * c.cap))?;
        }
    }
    Ok(())
}

/// Appends each segment's K/V rows to its cache, which must hold exactly `start_pos` rows (the drafter's context).
pub(crate) fn kv_append(
    be: &CudaBackend,
    k: &CudaBuf,
    v: &CudaBuf,
    segs: &[Segment],
    caches: &mut [&mut CudaKv],
) -> Result<(), KernelError> {
    check_caches(segs, caches.len())?;
    let width = caches.first().map_or(0, |c| c.width);
    let n_rows = segs.iter().map(|s| s.first_row + s.rows).max().unwrap_or(0);
    check_len("kv_append", "k", k.len(), n_rows * width)?;
    check_len("kv_append", "v", v.len(), n_rows * width)?;
    check_cache_state("kv_append", segs, width, |i| (caches[i].width, caches[i].len))?;
    append(be, k, v, segs, caches).map_err(|e| e.kernel("kv_append"))
}

/// Grows the named caches (amortized doubling, as a Vec), copies each segment's rows in with one launch, and
/// advances the host-tracked lengths.
fn append(
    be: &CudaBackend,
    k: &CudaBuf,
    v: &CudaBuf,
    segs: &[Segment],
    caches: &mut [&mut CudaKv],
) -> Result<(), CudaError> {
    reserve(segs, caches)?;
    let width = caches.first().map_or(0, |c| c.width);
    let mut table: Vec<u64> = Vec::with_capacity(4 * segs.len());
    let mut most = 0;
    for s in segs.iter().filter(|s| s.rows > 0 && width > 0) {
        let c = &caches[s.cache];
        let (kp, vp) = c.ptrs();
        let at = f32_bytes(c.len * width)? as u64;
        table.extend([kp + at, vp + at, s.first_row as u64, s.rows as u64]);
        most = most.max(s.rows * width);
    }
    if !table.is_empty() {
        let tm = be.dev.stage(&table)?;
        let base = tm.as_ref().map_or(0, |m| m.ptr);
        let f = be.func(Src::Attention, "kv_append")?;
        let (kp, vp) = (k.ptr()?, v.ptr()?);
        let gx = blocks(most)?.min(1024);
        for (i, chunk) in table.chunks(4 * GRID_YZ).enumerate() {
            let at = base + (i * 4 * GRID_YZ * 8) as u64;
            let args = [Arg::P(kp), Arg::P(vp), Arg::P(at), Arg::I(int(width, "width")?)];
            be.dev.launch(&f, (gx, (chunk.len() / 4) as u32, 1), BLOCK, 0, &args)?;
        }
    }
    for s in segs {
        caches[s.cache].len += s.rows;
    }
    Ok(())
}

/// Non-causal attention of each segment's rows over its cache's `start_pos` rows and all the segment's own k/v
/// rows (DSpark's block pass); no cache changes.
#[allow(clippy::too_many_arguments)]
pub(crate) fn block_attention(
    be: &CudaBackend,
    q: &CudaBuf,
    k: &CudaBuf,
    v: &CudaBuf,
    heads: usize,
    kv_heads: usize,
    segs: &[Segment],
    caches: &[&CudaKv],
    out: &mut CudaBuf,
) -> Result<(), KernelError> {
    check_caches(segs, caches.len())?;
    if segs.is_empty() && q.is_empty() && k.is_empty() && v.is_empty() && out.is_empty() {
        return Ok(());
    }
    let width = caches.first().map_or(0, |c| c.width);
    let (hd, group) = geometry("block_attention", heads, kv_heads, width)?;
    let n_rows = segs.iter().map(|s| s.first_row + s.rows).max().unwrap_or(0);
    check_len("block_attention", "q", q.len(), n_rows * heads * hd)?;
    check_len("block_attention", "k", k.len(), n_rows * width)?;
    check_len("block_attention", "v", v.len(), n_rows * width)?;
    check_len("block_attention", "out", out.len(), n_rows * heads * hd)?;
    row_positions(segs, n_rows)?;
    check_cache_state("block_attention", segs, width, |i| (caches[i].width, caches[i].len))?;
    let mut desc = vec![0u64; 4 * n_rows];
    let mut keys = vec![0usize; n_rows];
    for s in segs {
        let (kp, vp) = caches[s.cache].ptrs();
        let counts = u32_of(s.start_pos, "context length")? | (u32_of(s.rows, "block rows")? << 32);
        for r in s.first_row..s.first_row + s.rows {
            desc[4 * r..4 * r + 4].copy_from_slice(&[kp, vp, counts, s.first_row as u64]);
            keys[r] = s.start_pos + s.rows;
        }
    }
    let mma = mma_form(be, "block_attention", hd, group)?;
    let rows = Rows::new(&desc, &keys, segs, tile_rows(mma, group));
    run(be, (q, k, v), (heads, group, hd, width), &rows, mma, None, out).map_err(|e| e.kernel("block_attention"))
}

/// What every launch of one call's partials shares: the kernels' pointers and shape arguments.
struct Launch {
    /// q, k, v, the staged row descriptors, the partials scratch, out.
    ptrs: [u64; 6],
    heads: i32,
    group: i32,
    hd: i32,
    width: i32,
    chunks: i32,
    scale: f32,
}

impl Launch {
    /// The arguments attn_partial, attn_tiled and attn_mma share, `table` last: attn_partial's row list (0: the rows
    /// from `row0` in order) or the tiled forms' tile words.
    fn args(&self, row0: i32, table: u64) -> [Arg; 13] {
        let [qp, kp, vp, dp, pp, _] = self.ptrs;
        [
            Arg::P(qp),
            Arg::P(kp),
            Arg::P(vp),
            Arg::P(dp),
            Arg::I(self.heads),
            Arg::I(self.group),
            Arg::I(self.hd),
            Arg::I(self.width),
            Arg::F(self.scale),
            Arg::I(self.chunks),
            Arg::P(pp),
            Arg::I(row0),
            Arg::P(table),
        ]
    }

    /// attn_partial over `nl` rows from `row0`, or over the staged row list `rows` (`nl` of them).
    fn partial(&self, be: &CudaBackend, row0: i32, nl: usize, rows: u64) -> Result<(), CudaError> {
        let f = be.func(Src::Attention, "attn_partial")?;
        let smem = ((self.hd as usize + 2 * KEY_CHUNK) * 4) as u32;
        let grid = (self.chunks as u32, self.heads as u32, nl as u32);
        be.dev.launch(&f, grid, BLOCK, smem, &self.args(row0, rows))
    }

    /// attn_tiled over the staged tile words `tiles` (`n` of them).
    fn tiled(&self, be: &CudaBackend, row0: i32, n: usize, tiles: u64) -> Result<(), CudaError> {
        let f = be.func(Src::Attention, "attn_tiled")?;
        let smem = tile_smem(self.hd as usize);
        be.dev.allow_smem(&f, smem)?;
        let grid = (self.chunks as u32, (self.heads / self.group) as u32, n as u32);
        be.dev.launch(&f, grid, BLOCK, smem as u32, &self.args(row0, tiles))
    }

    /// `entry` (attn_mma, the tensor-core form, or attn_mma_few, its form for decode tiles) over the staged tile
    /// words `tiles` (`n` of them).
    fn mma(&self, be: &CudaBackend, entry: &'static str, row0: i32, n: usize, tiles: u64) -> Result<(), CudaError> {
        let f = be.func(Src::Attention, entry)?;
        let smem = mma_smem(self.hd as usize);
        be.dev.allow_smem(&f, smem)?;
        let grid = (self.chunks as u32, (self.heads / self.group) as u32, n as u32);
        be.dev.launch(&f, grid, MMA_THREADS, smem as u32, &self.args(row0, tiles))
    }

    /// attn_combine over `nl` rows from `row0`; with `append`, each row's k, v also go to its cache row.
    fn combine(&self, be: &CudaBackend, row0: i32, nl: usize, append: bool) -> Result<(), CudaError> {
        let [_, kp, vp, dp, pp, op] = self.ptrs;
        let args = [
            Arg::P(dp),
            Arg::P(pp),
            Arg::I(self.heads),
            Arg::I(self.hd),
            Arg::I(self.chunks),
            Arg::P(op),
            Arg::I(row0),
            Arg::P(kp),
            Arg::P(vp),
            Arg::I(self.width),
            Arg::I(append as i32),
        ];
        let f = be.func(Src::Attention, "attn_combine")?;
        let block = ((self.hd as usize).min(256).div_ceil(32) * 32) as u32;
        be.dev.launch(&f, (self.heads as u32, nl as u32, 1), block, 0, &args)
    }
}

/// The partial and combine launches over all rows, in launches of at most [`GRID_YZ`] rows that fit the scratch
/// budget. With `mma` every tile runs the tensor-core form; else where
/// [`Dev::attn_tiled`](super::device::Dev::attn_tiled) says so, a launch's tiles of two rows or more take the tiled
/// form and its one-row segments attn_partial (the same bits either way). `append` (the cache row width): the
/// combine also copies each row's k, v to its cache row.
#[allow(clippy::too_many_arguments)]
fn run(
    be: &CudaBackend,
    (q, k, v): (&CudaBuf, &CudaBuf, &CudaBuf),
    (heads, group, hd, width): (usize, usize, usize, usize),
    rows: &Rows,
    mma: bool,
    append: Option<usize>,
    out: &mut CudaBuf,
) -> Result<(), CudaError> {
    let n_rows = rows.keys.len();
    if n_rows == 0 {
        return Ok(());
    }
    let max_chunks = rows.keys.iter().copied().max().unwrap_or(0).div_ceil(KEY_CHUNK).max(1);
    let per_row = mul(mul(heads, max_chunks)?, hd + 2)?;
    let launch_rows = (SCRATCH_FLOATS / per_row).clamp(1, GRID_YZ).min(n_rows);
    let part = be.dev.alloc(f32_bytes(mul(launch_rows, per_row)?)?)?;
    let dm = be.dev.stage(rows.desc)?;
    let tiled = !mma && hd <= TILE_HD && hd.is_multiple_of(4) && be.dev.attn_tiled(rows.widest, tile_smem(hd));
    let ptrs = [
        q.ptr()?,
        k.ptr()?,
        v.ptr()?,
        dm.as_ref().map_or(0, |m| m.ptr),
        part.as_ref().map_or(0, |m| m.ptr),
        out.ptr()?,
    ];
    let l = Launch {
        ptrs,
        heads: heads as i32,
        group: group as i32,
        hd: hd as i32,
        width: int(width, "width")?,
        chunks: int(max_chunks, "chunks")?,
        scale: 1.0 / (hd as f32).sqrt(),
    };
    for row0 in (0..n_rows).step_by(launch_rows) {
        let nl = launch_rows.min(n_rows - row0);
        let r0 = int(row0, "row")?;
        if mma {
            let (few, tiles) = by_pairs(rows.cut(row0, row0 + nl), group);
            for (entry, words) in [("attn_mma_few", few), ("attn_mma", tiles)] {
                if !words.is_empty() {
                    let tm = be.dev.stage(&words)?;
                    l.mma(be, entry, r0, words.len(), tm.as_ref().map_or(0, |m| m.ptr))?;
                }
            }
        } else if tiled {
            let (tiles, singles) = rows.tile_words(row0, row0 + nl);
            if !tiles.is_empty() {
                let tm = be.dev.stage(&tiles)?;
                l.tiled(be, r0, tiles.len(), tm.as_ref().map_or(0, |m| m.ptr))?;
            }
            if !singles.is_empty() {
                let sm = be.dev.stage(&singles)?;
                l.partial(be, r0, singles.len(), sm.as_ref().map_or(0, |m| m.ptr))?;
            }
        } else {
            l.partial(be, r0, nl, 0)?;
        }
        l.combine(be, r0, nl, append.is_some())?;
    }
    Ok(())
}

/// The tensor-core form's tile words (low 32 bits the first row, high 32 the rows) split into those of at most
/// [`FEW_PAIRS`] (row, query head) pairs at `group` heads a KV head, for attn_mma_few (decode rows), and the rest,
/// for attn_mma; each keeps its order. Either entry gives a tile the same bits (gate `invariance` of
/// `cuda.attention_tc`), so this only picks the faster one.
fn by_pairs(words: impl Iterator<Item = u64>, group: usize) -> (Vec<u64>, Vec<u64>) {
    words.partition(|w| (w >> 32) as usize * group <= FEW_PAIRS)
}

/// Pairs a tile of attn_mma_few holds: one warp's mma rows (attention_mma.cu's `attn_mma_few_body`).
const FEW_PAIRS: usize = 16;

#[cfg(test)]
mod tests {
    use super::*;

    /// Tiles of at most 16 pairs go to attn_mma_few, in order; the rest to attn_mma.
    #[test]
    fn decode_tiles_go_to_the_few_pair_form() {
        let word = |f: u64, n: u64| f | (n << 32);
        let words = [word(0, 1), word(1, 16), word(17, 4), word(21, 5), word(26, 2)];
        let (few, tiles) = by_pairs(words.into_iter(), 4);
        assert_eq!(few, vec![word(0, 1), word(17, 4), word(26, 2)]);
        assert_eq!(tiles, vec![word(1, 16), word(21, 5)]);
        let (few, tiles) = by_pairs(words.into_iter(), 32);
        assert!(few.is_empty());
        assert_eq!(tiles.len(), 5);
        let (few, _) = by_pairs(words.into_iter(), 16);
        assert_eq!(few, vec![word(0, 1)]);
    }

    /// Tiles stay inside their segment, hold at most [`ATTN_TILE`] rows, and a launch's cut sends its one-row
    /// pieces to attn_partial.
    #[test]
    fn tiles_follow_segments_and_launch_cuts() {
        let seg = |first_row, rows| Segment { first_row, rows, start_pos: 0, cache: 0 };
        let segs = [seg(0, 1), seg(1, 40), seg(41, 2)];
        let rows = Rows::new(&[], &[], &segs, ATTN_TILE);
        assert_eq!(rows.tiles, vec![(0, 1), (1, 16), (17, 16), (33, 8), (41, 2)]);
        assert_eq!(rows.widest, 40);
        let word = |f: u64, n: u64| f | (n << 32);
        assert_eq!(rows.tile_words(0, 43), (vec![word(1, 16), word(17, 16), word(33, 8), word(41, 2)], vec![0]));
        assert_eq!(rows.tile_words(0, 20), (vec![word(1, 16), word(17, 3)], vec![0]));
        assert_eq!(rows.tile_words(20, 43), (vec![word(20, 13), word(33, 8), word(41, 2)], vec![]));
        assert_eq!(rows.tile_words(18, 19), (vec![], vec![18]));
        assert_eq!(rows.tile_words(42, 43), (vec![], vec![42]));
    }

    /// The tensor-core form serves head_dim 8, 16, ..., 64 and refuses the rest by name.
    #[test]
    fn tensor_core_shapes_are_refused_by_name() {
        for hd in [8, 24, 32, 64] {
            assert!(mma_shape("attention", hd, 4).is_ok(), "{hd}");
        }
        for (hd, group) in [(12, 4), (72, 4), (128, 4), (64, 65)] {
            let e = mma_shape("attention", hd, group).unwrap_err();
            assert!(matches!(e, KernelError::Shape { kernel: "attention", .. }), "{e}");
            assert!(e.to_string().contains("tensor cores"), "{e}");
        }
    }

    /// The tensor-core form's tiles hold `MMA_PAIRS / group` rows, one-row tiles included.
    #[test]
    fn tensor_core_tiles_hold_64_pairs() {
        let seg = |first_row, rows| Segment { first_row, rows, start_pos: 0, cache: 0 };
        let segs = [seg(0, 1), seg(1, 20)];
        let rows = Rows::new(&[], &[], &segs, tile_rows(true, 4));
        let word = |f: u64, n: u64| f | (n << 32);
        assert_eq!(rows.cut(0, 21).collect::<Vec<_>>(), vec![word(0, 1), word(1, 16), word(17, 4)]);
        assert_eq!(rows.cut(5, 18).collect::<Vec<_>>(), vec![word(5, 12), word(17, 1)]);
        assert_eq!(tile_rows(true, 1), 64);
        assert_eq!(tile_rows(true, 64), 1);
        assert_eq!(mma_smem(64), 4 * 3 * (64 * 36 + 64 * 36 + 128 * 16) + 4 * 2 * 8 * 128);
        assert_eq!(mma_smem(8), mma_smem(16));
        assert!(mma_smem(MMA_HD) <= 232_448);
    }

    #[test]
    fn the_tiled_form_fits_the_h200s_shared_memory_at_head_dim_64() {
        assert_eq!(tile_smem(64), 4 * (256 * 65 + 256 * 64 + 8 * 4 * 320));
        assert!(tile_smem(TILE_HD) <= 232_448);
    }
}
