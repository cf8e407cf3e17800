//! Launcher of the MoE block on the device, with no host round trip: router linear, routing, the expert plan (with
//! the routing in one launch for few rows), the grouped gate-up and down tiles (each active expert's weights read
//! once a call), and the rank-order combine.

use super::device::{Arg, BLOCK, GRID_YZ, Mem, RT, Src, TCM, WPB, WTM};
use super::ops::{blocks, expect, int, linear, mul, same_kind, wide_form};
use super::tc::TcPlan;
use super::types::{CudaBuf, CudaMat, f32_bytes};
use super::{CudaBackend, CudaError};
use crate::backend::{Ffn, MoeParams};

/// Threads of the plan kernel's single block.
const PLAN_THREADS: u32 = 1024;

/// Routing: the router linear, then `moe_route` (a warp a row) into `sel` `[rows, k]` (expert ids as f32) and `wts`
/// `[rows, k]`, `k = min(top_k, experts)`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn route(
    be: &CudaBackend,
    x: &CudaBuf,
    rows: usize,
    gate: &CudaMat,
    expert_bias: Option<&CudaBuf>,
    p: MoeParams,
    sel: &mut CudaBuf,
    wts: &mut CudaBuf,
) -> Result<(), CudaError> {
    route_launch(be, x, rows, (gate, expert_bias, p), (sel, wts), None)
}

/// The router linear, then `moe_route` over many blocks or, with `plan`, `moe_route_plan` (routing and the plan of
/// every expert in one block).
fn route_launch(
    be: &CudaBackend,
    x: &CudaBuf,
    rows: usize,
    (gate, expert_bias, p): (&CudaMat, Option<&CudaBuf>, MoeParams),
    (sel, wts): (&mut CudaBuf, &mut CudaBuf),
    plan: Option<&Plan>,
) -> Result<(), CudaError> {
    let (h, ne) = (gate.cols, gate.rows);
    let kk = p.top_k.min(ne);
    expect(x.len() == mul(rows, h)?, || format!("moe_route: x is not [{rows}, {h}]"))?;
    expect(sel.len() == mul(rows, kk)? && wts.len() == sel.len(), || {
        format!("moe_route: sel/wts are not [{rows}, {kk}]")
    })?;
    expect(expert_bias.is_none_or(|b| b.len() == ne), || format!("moe: expert_bias is not [{ne}]"))?;
    expect(ne <= 1024, || format!("moe: {ne} experts; the routing kernel takes at most 1024"))?;
    if rows == 0 || kk == 0 {
        return Ok(());
    }
    let mut logits = be.buf(mul(rows, ne)?)?;
    linear(be, x, rows, gate, None, &mut logits)?;
    let mut args = vec![
        Arg::P(logits.ptr()?),
        Arg::I(int(rows, "rows")?),
        Arg::I(int(ne, "experts")?),
        Arg::P(expert_bias.map_or(Ok(0), |b| b.ptr())?),
        Arg::I(int(kk, "top_k")?),
        Arg::I(p.norm_topk_prob as i32),
        Arg::F(p.routed_scaling_factor),
        Arg::P(sel.ptr()?),
        Arg::P(wts.ptr()?),
    ];
    match plan {
        None => {
            let f = be.func(Src::Moe, "moe_route")?;
            be.dev.launch(&f, (int(rows.div_ceil(WPB), "blocks")? as u32, 1, 1), BLOCK, 0, &args)
        }
        Some(plan) => {
            args.extend(plan.args()?);
            let f = be.func(Src::Moe, "moe_route_plan")?;
            be.dev.launch(&f, (1, 1, 1), BLOCK, 0, &args)
        }
    }
}

/// The owned experts (`owned` = experts `first ..` of `total`) of every assignment of `sel` `[rows, k]` into `y`
/// `[rows * k, hidden]`: the plan, then the grouped gate-up and down tiles; unowned assignments get +0.
pub(crate) fn experts(
    be: &CudaBackend,
    x: &CudaBuf,
    rows: usize,
    sel: &CudaBuf,
    kk: usize,
    (owned, first, total): (&[Ffn<CudaMat>], usize, usize),
    y: &mut CudaBuf,
) -> Result<(), CudaError> {
    let nassign = mul(rows, kk)?;
    expect(sel.len() == nassign, || format!("moe_experts: sel is not [{rows}, {kk}]"))?;
    let h = x.len().checked_div(rows).unwrap_or(0);
    expect(x.len() == mul(rows, h)? && y.len() == mul(nassign, h)?, || {
        format!("moe_experts: y is not [{nassign}, {h}]")
    })?;
    if nassign == 0 || h == 0 {
        return Ok(());
    }
    if owned.is_empty() {
        return be.dev.memset(y.ptr()?, 0, f32_bytes(y.len())?);
    }
    let inter = check_experts(owned, h)?;
    let ne = owned.len();
    expect(ne <= 1024, || format!("moe_experts: {ne} owned experts; the plan takes at most 1024"))?;
    // Only a partial owner leaves slots the tiles do not write.
    if first > 0 || ne < total {
        be.dev.memset(y.ptr()?, 0, f32_bytes(y.len())?)?;
    }
    let tc = be.dev.tensor_cores() && super::tc::experts_ok(owned);
    let wide = be.dev.wide_moe(rows, nassign, total) && (tc || wide_experts(owned, inter, h));
    let slots = match (wide, tc) {
        (true, true) => TCM,
        (true, false) => WTM,
        (false, _) => RT,
    };
    let (scratch, plan) = plan_scratch(be, nassign, ne, slots)?;
    let f = be.func(Src::Moe, "moe_plan")?;
    let args = [
        Arg::P(sel.ptr()?),
        Arg::I(int(nassign, "assignments")?),
        Arg::I(int(first, "first expert")?),
        Arg::I(int(ne, "experts")?),
    ];
    let rt = Arg::I(int(plan.rt, "tile slots")?);
    let args: Vec<Arg> = args.into_iter().chain(plan.args()?).chain([rt]).collect();
    be.dev.launch(&f, (1, 1, 1), PLAN_THREADS, 0, &args)?;
    run_tiles(be, x, rows, kk, owned, inter, &plan, y)?;
    drop(scratch);
    Ok(())
}

/// Whether both expert kernels have wide forms for these experts (a wide call then plans tiles of [`WTM`] slots).
fn wide_experts(owned: &[Ffn<CudaMat>], inter: usize, h: usize) -> bool {
    owned
        .first()
        .is_some_and(|f| wide_form(&f.w1, "moe_gateup", inter).is_some() && wide_form(&f.w2, "moe_down", h).is_some())
}

/// The plan's int scratch (list | tiles, 3 a tile | ntiles) for `nassign` assignments over `ne` experts in tiles of
/// at most `rt` slots, and its addresses (the scratch must outlive the tile launches).
fn plan_scratch(be: &CudaBackend, nassign: usize, ne: usize, rt: usize) -> Result<(Option<Mem>, Plan), CudaError> {
    let bound = ne.min(nassign) + nassign / rt;
    let ints = nassign + 3 * bound + 1;
    let scratch = be.dev.alloc(mul(ints, 4)?)?;
    let base = scratch.as_ref().map_or(0, |m| m.ptr);
    let at = |words: usize| base + 4 * words as u64;
    Ok((scratch, Plan { list: at(0), tiles: at(nassign), ntiles: at(nassign + 3 * bound), bound, rt }))
}

/// The grouped gate-up and down tiles of a plan over `owned` into `y` `[rows * k, hidden]`.
#[allow(clippy::too_many_arguments)]
fn run_tiles(
    be: &CudaBackend,
    x: &CudaBuf,
    rows: usize,
    kk: usize,
    owned: &[Ffn<CudaMat>],
    inter: usize,
    plan: &Plan,
    y: &mut CudaBuf,
) -> Result<(), CudaError> {
    let h = x.len() / rows;
    let tab = be.dev.constant(&expert_table(owned)?)?;
    let one_row = be.dev.one_row(rows);
    let t = Tiles { tab, plan, kk: int(kk, "top_k")?, one_row, wide: plan.rt == WTM };
    let act = be.buf(mul(mul(rows, kk)?, inter)?)?;
    if be.dev.tensor_cores() && super::tc::experts_ok(owned) {
        let p = TcPlan {
            tab,
            tiles: plan.tiles,
            ntiles: plan.ntiles,
            list: plan.list,
            bound: plan.bound,
            kk: t.kk,
            wide: plan.rt == TCM,
        };
        let (w1, w2) = (&owned[0].w1, &owned[0].w2);
        super::tc::grouped(be, ("moe_gateup", w1), (x.ptr()?, act.ptr()?), (h, inter), &p)?;
        return super::tc::grouped(be, ("moe_down", w2), (act.ptr()?, y.ptr()?), (inter, h), &p);
    }
    grouped(be, &owned[0].w1, "moe_gateup", (x.ptr()?, act.ptr()?), (h, inter), &t)?;
    grouped(be, &owned[0].w2, "moe_down", (act.ptr()?, y.ptr()?), (inter, h), &t)
}

/// Calls of at most this many rows route and plan in one launch (`moe_route_plan`, one block of [`BLOCK`] threads,
/// 2 rows a warp at most): decode and verify rounds; a wider call keeps a warp a row over many blocks. The block is
/// 256 threads, not the plan's 1024, because routing keeps a row's scores in up to 64 registers a thread.
const ROUTE_PLAN_ROWS: usize = 16;

/// Routing and every expert on one device ([`route`] then [`experts`] over all experts), with the routing and the
/// plan in one launch for calls of at most [`ROUTE_PLAN_ROWS`] rows. `sel` and `wts` `[rows, k]`, `y` `[rows * k,
/// hidden]`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn route_experts(
    be: &CudaBackend,
    x: &CudaBuf,
    rows: usize,
    gate: &CudaMat,
    expert_bias: Option<&CudaBuf>,
    all: &[Ffn<CudaMat>],
    p: MoeParams,
    (sel, wts): (&mut CudaBuf, &mut CudaBuf),
    y: &mut CudaBuf,
) -> Result<(), CudaError> {
    let (h, ne) = (gate.cols, gate.rows);
    let kk = p.top_k.min(ne);
    let small = be.dev.fused && rows <= ROUTE_PLAN_ROWS && !all.is_empty() && all.len() == ne;
    if !small || rows == 0 || kk == 0 || h == 0 {
        route(be, x, rows, gate, expert_bias, p, sel, wts)?;
        return experts(be, x, rows, sel, kk, (all, 0, ne), y);
    }
    expect(y.len() == mul(mul(rows, kk)?, h)?, || format!("moe: y is not [{rows} * {kk}, {h}]"))?;
    let inter = check_experts(all, h)?;
    let (scratch, plan) = plan_scratch(be, mul(rows, kk)?, ne, RT)?;
    route_launch(be, x, rows, (gate, expert_bias, p), (sel, wts), Some(&plan))?;
    run_tiles(be, x, rows, kk, all, inter, &plan, y)?;
    drop(scratch);
    Ok(())
}

/// The rank-order combine of `y` `[rows * k, hidden]` weighted by `wts` `[rows, k]` into `out` `[rows, hidden]`.
pub(crate) fn combine(
    be: &CudaBackend,
    y: &CudaBuf,
    wts: &CudaBuf,
    rows: usize,
    kk: usize,
    out: &mut CudaBuf,
) -> Result<(), CudaError> {
    let h = out.len().checked_div(rows).unwrap_or(0);
    expect(wts.len() == mul(rows, kk)? && y.len() == mul(wts.len(), h)?, || {
        format!("moe_combine: y/wts for [{rows}, {kk}]")
    })?;
    if rows == 0 || h == 0 {
        return Ok(());
    }
    if kk == 0 {
        return be.dev.memset(out.ptr()?, 0, f32_bytes(out.len())?);
    }
    let f = be.func(Src::Moe, "moe_combine")?;
    let args = [
        Arg::P(y.ptr()?),
        Arg::P(wts.ptr()?),
        Arg::I(int(rows, "rows")?),
        Arg::I(int(kk, "top_k")?),
        Arg::I(int(h, "hidden")?),
        Arg::P(out.ptr()?),
    ];
    be.dev.launch(&f, (blocks(mul(rows, h)?)?, 1, 1), BLOCK, 0, &args)
}

/// `moe_combine_add_rmsnorm` (rows.cu): `acc += combine(y, wts)`, then with `norm` `out = rmsnorm(acc) * weight`;
/// one block a row. `y` `[rows * k, width]`, `wts` `[rows, k]`, `acc` and `out` `[rows, width]`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn combine_add_rmsnorm(
    be: &CudaBackend,
    (y, wts): (&CudaBuf, &CudaBuf),
    rows: usize,
    kk: usize,
    acc: &mut CudaBuf,
    norm: Option<(&CudaBuf, f32)>,
    width: usize,
    out: &mut CudaBuf,
) -> Result<(), CudaError> {
    let n = mul(rows, width)?;
    expect(wts.len() == mul(rows, kk)? && y.len() == mul(wts.len(), width)? && acc.len() == n, || {
        format!("moe_combine_add_rmsnorm: y/wts/acc for [{rows}, {kk}] of width {width}")
    })?;
    expect(norm.is_none_or(|(w, _)| w.len() == width && out.len() == n), || {
        format!("moe_combine_add_rmsnorm: weight is not [{width}] or out not [{rows}, {width}]")
    })?;
    if n == 0 {
        return Ok(());
    }
    let f = be.func(Src::Rows, "moe_combine_add_rmsnorm")?;
    let (wp, eps, op) = match norm {
        Some((w, eps)) => (w.ptr()?, eps, out.ptr()?),
        None => (0, 0.0, 0),
    };
    let args = [
        Arg::P(acc.ptr()?),
        Arg::P(y.ptr()?),
        Arg::P(wts.ptr()?),
        Arg::I(int(kk, "top_k")?),
        Arg::P(wp),
        Arg::F(eps),
        Arg::I(int(width, "width")?),
        Arg::I(int(rows, "rows")?),
        Arg::P(op),
    ];
    be.dev.launch(&f, (int(rows, "rows")? as u32, 1, 1), BLOCK, 0, &args)
}

/// Device addresses of the expert plan: slot list, tiles (3 ints a tile), tile count, and the most tiles.
struct Plan {
    list: u64,
    tiles: u64,
    ntiles: u64,
    bound: usize,
    /// Slots a tile holds at most: [`RT`] for the warp kernels (and the narrow tensor-core tiles), [`WTM`] for the
    /// wide tiles, [`TCM`] for the wide tensor-core tiles.
    rt: usize,
}

impl Plan {
    /// The plan's outputs as a kernel's last four arguments (moe.cu's `list, tiles, ntiles, bound`).
    fn args(&self) -> Result<[Arg; 4], CudaError> {
        Ok([Arg::P(self.list), Arg::P(self.tiles), Arg::P(self.ntiles), Arg::I(int(self.bound, "tiles")?)])
    }
}

/// What the grouped tile kernels read: the expert table, the plan, top-k.
struct Tiles<'a> {
    tab: u64,
    plan: &'a Plan,
    kk: i32,
    /// Whether the `_r1` kernels run ([`super::device::Dev::one_row`] over the layer's rows).
    one_row: bool,
    /// Whether the wide tiles run (the plan's tiles hold up to [`WTM`] slots).
    wide: bool,
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
    t: &Tiles,
) -> Result<(), CudaError> {
    let plan = t.plan;
    let (ki, ni, gi) = (int(k, "cols")?, int(n, "outputs")?, int(m.group, "group")?);
    let mut args = vec![Arg::P(io.0), Arg::I(ki), Arg::I(ni), Arg::P(t.tab), Arg::I(gi)];
    args.extend([plan.tiles, plan.ntiles, plan.list].map(Arg::P));
    if kind == "moe_gateup" {
        args.push(Arg::I(t.kk));
    }
    args.push(Arg::P(io.1));
    if t.wide {
        // Grid x the plan's tiles (up to 2^31 - 1), y the column blocks: wide_experts checked the form exists.
        let (name, cols) = m.kernel_wide(kind).ok_or_else(|| CudaError::Shape(format!("{kind}: no wide form")))?;
        let f = be.func(Src::Dense, &name)?;
        let grid = (int(plan.bound, "tiles")? as u32, n.div_ceil(cols) as u32, 1);
        return be.dev.launch(&f, grid, BLOCK, 0, &args);
    }
    let (name, cols) = m.kernel_for(kind, t.one_row);
    let f = be.func(Src::Dense, &name)?;
    let gx = int(n.div_ceil(cols), "blocks")? as u32;
    args.push(Arg::I(0));
    let last = args.len() - 1;
    for tile0 in (0..plan.bound).step_by(GRID_YZ) {
        let count = (plan.bound - tile0).min(GRID_YZ) as u32;
        args[last] = Arg::I(int(tile0, "tile")?);
        be.dev.launch(&f, (gx, count, 1), BLOCK, 0, &args)?;
    }
    Ok(())
}
