#!/usr/bin/env bash
# Session 31, prepared, never ran (no device lent after the session's first minutes).
# Session 31, call 1: the wide form of four warps, each 16 rows by 128 columns, activations split in registers (B)
# against f148a35 (A): MoE fixtures exact on B with the wide stage from 16 rows, prefill 512 and 2,048 A B B A (hash
# each run), then Nsight Compute of B's and A's wide bf16 kernels at 2,048 tokens.
set -uo pipefail
BUDGET=${BUDGET:-570}
# carry/bin: prev.xz (A = main), tensorfold.xz (B = main + wide-warp-rows.patch), c.xz (B with TCW_BLOCKS 2).
. tools/cuda/env.sh "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,memory.total --format=csv > "$OUT/gpu.txt"; cat "$OUT/gpu.txt"
export TENSORFOLD_CUDA_TENSOR_CORES=1
M=synthetic:lfm2.5-24b-a2b
for fx in lfm2-moe-bf16-fused mlx/lfm2-moe-bf16-q4g64; do
  d=tests/fixtures/$fx; [ -d "$d" ] || continue
  RUN_TAIL=4 TENSORFOLD_CUDA_WIDE_ROWS=16 run "exact-${fx//\//-}" 150 "$BIN" exact --device cuda --model $d --reference $d/reference.safetensors
done
C_BIN=$PWD/carry/bin/c; [ -x "$C_BIN" ] || { xz -dkc carry/bin/c.xz > "$C_BIN" && chmod +x "$C_BIN"; }
# C: B compiled for two blocks an SM (registers up to 255, no spills).
for r in A1 B1 C1 C2 B2 A2; do
  case $r in A*) bin=$PREV_BIN ;; B*) bin=$BIN ;; C*) bin=$C_BIN ;; esac
  [ "$(left)" -gt 150 ] || break
  timeout 140 "$bin" bench forward --device cuda --model $M --prompt-lens 512,2048 --decode 16 > "$OUT/f-$r.log" 2>&1
  echo "-- f $r rc=$?"; grep -E "exactness|prefill|decode  " "$OUT/f-$r.log"
done
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
echo "ncu: $NCU"
MET="sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__inst_executed_pipe_tensor_op_hmma.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.avg.pct_of_peak_sustained_elapsed,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
for side in B A; do  # A only if time is left: the shared-memory wavefronts of both forms
  bin=$BIN; [ $side = A ] && bin=$PREV_BIN
  [ "$(left)" -gt 90 ] || break
  TENSORFOLD_CUDA_GRAPHS=0 timeout $(( $(left) - 30 )) "$NCU" --clock-control none -k "regex:moe_gateup_tcw_bf16|moe_down_tcw_bf16|linear_tcw_bf16" \
    --launch-skip 0 --launch-count 6 --section SpeedOfLight --section Occupancy --section SchedulerStats --section WarpStateStats --section LaunchStats --metrics "$MET" \
    "$bin" bench forward --device cuda --model $M --prompt-lens 2048 --decode 1 > "$OUT/ncu-$side.txt" 2>&1
  echo "-- ncu $side rc=$?"
  grep -E "^  [a-z_0-9]+ \(|Duration|SM Throughput|Memory Throughput|hmma|wavefronts|stalled_(barrier|long|short|math|mio|wait|not_sel|lg|dispatch|no_inst)|Achieved Occupancy|Registers Per|Issue Slots Busy|No Eligible" "$OUT/ncu-$side.txt" | head -120
done
printf '%s\n' "${summary[@]}"
echo "left: $(left)s"
cd "$OUT" && tar czf logs.tgz --remove-files $(ls) && ls -la "$OUT"
