//! Launcher of the MoE block on the device, with no host round trip: router linear, routing, the expert plan, the
//! grouped gate-up and down tiles (each active expert's weights read once a call), and the rank-order combine.

use super::device::{Arg, BLOCK, GRID_YZ, RT, Src, WPB};
use super::ops::{blocks, expect, int, linear, mul, same_kind};
use super::types::{CudaBuf, CudaMat, f32_bytes};
use super::{CudaBackend, CudaError};
use crate::backend::{Ffn, MoeParams};

/// Threads of the plan kernel's single block.
const PLAN_THREADS: u32 = 1024;

/// The MoE block over `x` `[rows, hidden]` into `out` `[rows, hidden]`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn moe(
    be: &CudaBackend,
    x: &CudaBuf,
    rows: usize,
    gate: &CudaMat,
    expert_bias: Option<&CudaBuf>,
    experts: &[Ffn<CudaMat>],
    p: MoeParams,
    out: &mut CudaBuf,
) -> Result<(), CudaError> {
    let (h, ne) = (gate.cols, gate.rows);
    expect(x.len() == mul(rows, h)? && out.len() == x.len(), || format!("moe: x/out are not [{rows}, {h}]"))?;
    expect(experts.len() == ne, || format!("moe: {} experts for a router of {ne}", experts.len()))?;
    expect(expert_bias.is_none_or(|b| b.len() == ne), || format!("moe: expert_bias is not [{ne}]"))?;
    expect(ne <= 1024, || format!("moe: {ne} experts; the routing kernel takes at most 1024"))?;
    let kk = p.top_k.min(ne);
    if rows == 0 {
        return Ok(());
    }
    if kk == 0 || h == 0 {
        return be.dev.memset(out.ptr()?, 0, f32_bytes(out.len())?);
    }
    let inter = check_experts(experts, h)?;
    let mut logits = be.buf(mul(rows, ne)?)?;
    linear(be, x, rows, gate, None, &mut logits)?;
    let nassign = mul(rows, kk)?;
    // One int scratch: sel | counts | offsets | fill | list | tiles (3 a tile) | ntiles.
    let bound = ne.min(nassign) + nassign / RT;
    let ints = nassign + 3 * ne + nassign + 3 * bound + 1;
    let scratch = be.dev.alloc(mul(ints, 4)?)?;
    let base = scratch.as_ref().map_or(0, |m| m.ptr);
    let at = |words: usize| base + 4 * words as u64;
    let (sel, counts, offsets, fill) = (at(0), at(nassign), at(nassign + ne), at(nassign + 2 * ne));
    let (list, tiles, ntiles) = (at(nassign + 3 * ne), at(2 * nassign + 3 * ne), at(2 * nassign + 3 * ne + 3 * bound));
    let wts = be.buf(nassign)?;
    let route = be.func(Src::Moe, "moe_route")?;
    let bias = match expert_bias {
        Some(b) => b.ptr()?,
        None => 0,
    };
    let (ri, nei, kki) = (int(rows, "rows")?, int(ne, "experts")?, int(kk, "top_k")?);
    let args = [
        Arg::P(logits.ptr()?),
        Arg::I(ri),
        Arg::I(nei),
        Arg::P(bias),
        Arg::I(kki),
        Arg::I(p.norm_topk_prob as i32),
        Arg::F(p.routed_scaling_factor),
        Arg::P(sel),
        Arg::P(wts.ptr()?),
    ];
    be.dev.launch(&route, (int(rows.div_ceil(WPB), "blocks")? as u32, 1, 1), BLOCK, 0, &args)?;
    let plan = be.func(Src::Moe, "moe_plan")?;
    let args = [
        Arg::P(sel),
        Arg::I(int(nassign, "assignments")?),
        Arg::I(nei),
        Arg::P(counts),
        Arg::P(offsets),
        Arg::P(fill),
        Arg::P(list),
        Arg::P(tiles),
        Arg::P(ntiles),
        Arg::I(int(bound, "tiles")?),
    ];
    be.dev.launch(&plan, (1, 1, 1), PLAN_THREADS, 0, &args)?;
    let tab = be.dev.constant(&expert_table(experts)?)?;
    let plan = Plan { tab, tiles, ntiles, list, kk: kki, bound };
    let act = be.buf(mul(nassign, inter)?)?;
    let y = be.buf(mul(nassign, h)?)?;
    grouped(be, &experts[0].w1, "moe_gateup", (x.ptr()?, act.ptr()?), (h, inter), &plan)?;
    grouped(be, &experts[0].w2, "moe_down", (act.ptr()?, y.ptr()?), (inter, h), &plan)?;
    let combine = be.func(Src::Moe, "moe_combine")?;
    let args =
        [Arg::P(y.ptr()?), Arg::P(wts.ptr()?), Arg::I(ri), Arg::I(kki), Arg::I(int(h, "hidden")?), Arg::P(out.ptr()?)];
    be.dev.launch(&combine, (blocks(mul(rows, h)?)?, 1, 1), BLOCK, 0, &args)
}

/// Device addresses of the expert plan.
struct Plan {
    tab: u64,
    tiles: u64,
    ntiles: u64,
    list: u64,
    kk: i32,
    bound: usize,
}

/// Every expert's w1 and w3 `[inter, hidden]` alike (one gate-up kernel reads them), every w2 `[hidden, inter]`
/// alike. Returns `inter`.
fn check_experts(experts: &[Ffn<CudaMat>], h: usize) -> Result<usize, CudaError> {
    let first = &experts[0];
    let inter = first.w1.rows;
    expect(first.w1.cols == h, || format!("moe: expert w1 has {} columns for hidden {h}", first.w1.cols))?;
    expect(first.w2.rows == h && first.w2.cols == inter, || format!("moe: expert w2 is not [{h}, {inter}]"))?;
    for e in experts {
        same_kind(&first.w1, &e.w1)?;
        same_kind(&first.w1, &e.w3)?;
        same_kind(&first.w2, &e.w2)?;
    }
    Ok(inter)
}

/// 9 words an expert: w1 (values, scales, biases), w3, w2 (dense.cu's expert_mat).
fn expert_table(experts: &[Ffn<CudaMat>]) -> Result<Vec<u64>, CudaError> {
    let mut t = Vec::with_capacity(9 * experts.len());
    for e in experts {
        for m in [&e.w1, &e.w3, &e.w2] {
            let (w, s, b) = m.ptrs()?;
            t.extend([w, s, b]);
        }
    }
    Ok(t)
}

/// One grouped expert kernel (`moe_gateup` reads `io.0` rows of width `k` and writes `n`-wide activations;
/// `moe_down` reads the activations and writes each assignment's output row), over up to `plan.bound` tiles in
/// launches of at most [`GRID_YZ`] tiles. Tiles past the plan's count return at once.
fn grouped(
    be: &CudaBackend,
    m: &CudaMat,
    kind: &str,
    io: (u64, u64),
    (k, n): (usize, usize),
    plan: &Plan,
) -> Result<(), CudaError> {
    let f = be.func(Src::Dense, &m.kernel(kind))?;
    let gx = int(n.div_ceil(WPB), "blocks")? as u32;
    let (ki, ni, gi) = (int(k, "cols")?, int(n, "outputs")?, int(m.group, "group")?);
    for tile0 in (0..plan.bound).step_by(GRID_YZ) {
        let count = (plan.bound - tile0).min(GRID_YZ) as u32;
        let t0 = int(tile0, "tile")?;
        let args: Vec<Arg> = if kind == "moe_gateup" {
            vec![
                Arg::P(io.0),
                Arg::I(ki),
                Arg::I(ni),
                Arg::P(plan.tab),
                Arg::I(gi),
                Arg::P(plan.tiles),
                Arg::P(plan.ntiles),
                Arg::P(plan.list),
                Arg::I(plan.kk),
                Arg::P(io.1),
                Arg::I(t0),
            ]
        } else {
            vec![
                Arg::P(io.0),
                Arg::I(ki),
                Arg::I(ni),
                Arg::P(plan.tab),
                Arg::I(gi),
                Arg::P(plan.tiles),
                Arg::P(plan.ntiles),
                Arg::P(plan.list),
                Arg::P(io.1),
                Arg::I(t0),
            ]
        };
        be.dev.launch(&f, (gx, count, 1), BLOCK, 0, &args)?;
    }
    Ok(())
}
