#!/usr/bin/env bash
# Session 30, prepared, never ran (no device time left): Nsight Compute of the wide bf16 kernels in a 2,048-token prefill, A (8f6720a; add B to the side loop for the tree under test):
# pipe utilization, issue activity, L2 and shared throughput, and the stall reasons an issued instruction.
set -uo pipefail
BUDGET=${BUDGET:-230}
. tools/cuda/env.sh "$OUT"
export TENSORFOLD_CUDA_TENSOR_CORES=1
M=synthetic:lfm2.5-24b-a2b
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
MET="sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active,lts__t_sectors.avg.pct_of_peak_sustained_elapsed,lts__throughput.avg.pct_of_peak_sustained_elapsed,l1tex__data_pipe_lsu_wavefronts_mem_shared.avg.pct_of_peak_sustained_elapsed,l1tex__throughput.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed,gpu__time_duration.sum,smsp__inst_executed.sum,smsp__inst_executed_pipe_tensor_op_hmma.sum,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
for side in A; do
  bin=$BIN; [ $side = A ] && bin=$PREV_BIN
  [ "$(left)" -gt 120 ] || break
  TENSORFOLD_CUDA_GRAPHS=0 timeout 150 "$NCU" --clock-control none -k "regex:moe_gateup_tcw_bf16|moe_down_tcw_bf16|linear_tcw_bf16" \
    --launch-skip 3 --launch-count 2 --metrics "$MET" \
    "$bin" bench forward --device cuda --model $M --prompt-lens 2048 --decode 1 > "$OUT/ncu-$side.txt" 2>&1
  echo "-- ncu $side rc=$?"
  grep -E "^  [a-z_0-9]+ \(|pct|duration|inst_executed|stalled" "$OUT/ncu-$side.txt" | grep -vE " 0(\.0+)?$" | head -90
done
echo "left: $(left)s"
cd "$OUT" && tar czf logs.tgz --remove-files $(ls) && ls -la "$OUT"
