#!/usr/bin/env bash
# Reruns the training recipe from scratch with the fixed seed: corpus -> tokenizer -> target -> data ->
# drafter -> measurements, exporting the pair to models/lfm2-moe-pycode and models/lfm2-moe-pycode-dspark.
#
#   tools/train/run.sh                    everything, on whatever torch sees (the H200 for the shipped pair)
#   tools/train/run.sh --smoke            a tiny CPU check of every stage (work in carry/train-smoke, models
#                                         written under carry/train-smoke/models; nothing in models/ changes)
#   tools/train/run.sh --stages target    only the named stages (comma-separated: corpus, tokenizer, target,
#                                         data, drafter, measure)
#   --target-steps N / --drafter-steps N  fixed step counts (a rerun passes the counts recorded in the
#                                         metrics when a wall-time guard cut a run short)
# The corpus stage checks carry/train/corpus.tar.gz against tools/train/corpus_manifest.txt, or builds it
# from this interpreter's standard library when it is missing (the manifest pins CPython 3.11.7's Lib).
# Logs: carry/train/*.log; metrics: carry/train/*_metrics.json, accept_*.json, summary.json.
# Environment: TARGET_DIR, DRAFTER_DIR (export folders), LOG_DIR (logs), TRAIN_WORK (work folder) override
# the defaults (the GPU runs point the exports and logs at the device tool's $OUT).
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1

SMOKE=0
STAGES="corpus,tokenizer,target,data,drafter,measure"
TARGET_STEPS=()
DRAFTER_STEPS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --smoke) SMOKE=1 ;;
    --stages) STAGES="$2"; shift ;;
    --target-steps) TARGET_STEPS=(--steps "$2"); shift ;;
    --drafter-steps) DRAFTER_STEPS=(--steps "$2"); shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done

if [ "$SMOKE" = 1 ]; then
  export TRAIN_WORK="$PWD/carry/train-smoke"
  SM=(--smoke)
  TARGET_DIR="$TRAIN_WORK/models/lfm2-moe-pycode"
  DRAFTER_DIR="$TRAIN_WORK/models/lfm2-moe-pycode-dspark"
  MEASURE=(--prompts 2 --new-tokens 16 --prompt-len 16)
else
  export TRAIN_WORK="${TRAIN_WORK:-$PWD/carry/train}"
  SM=()
  TARGET_DIR="${TARGET_DIR:-$PWD/models/lfm2-moe-pycode}"
  DRAFTER_DIR="${DRAFTER_DIR:-$PWD/models/lfm2-moe-pycode-dspark}"
  MEASURE=(--new-tokens 64)
fi
LOG_DIR="${LOG_DIR:-$TRAIN_WORK}"
mkdir -p "$TRAIN_WORK" "$LOG_DIR"

has() { case ",$STAGES," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }
stage() {  # name, command...: run it, tee its log, print its wall time
  local name="$1"; shift
  local t0; t0=$(date +%s.%N)
  echo "=== stage $name: $*"
  "$@" 2>&1 | tee "$LOG_DIR/$name.log"
  echo "=== stage $name: $(python3 -c "print(f'{$(date +%s.%N) - $t0:.1f}')")s"
}

if has corpus; then
  if [ "$SMOKE" = 1 ]; then
    stage corpus python3 tools/train/corpus.py build --smoke
  elif [ -f "$TRAIN_WORK/corpus.tar.gz" ]; then
    stage corpus python3 tools/train/corpus.py check
  else
    stage corpus python3 tools/train/corpus.py build
  fi
fi
has tokenizer && stage tokenizer python3 tools/train/tokenizer.py "${SM[@]}"
has target && stage target python3 tools/train/train_target.py "${SM[@]}" "${TARGET_STEPS[@]}" --out "$TARGET_DIR"
has data && stage data python3 tools/train/make_data.py "${SM[@]}" --target "$TARGET_DIR"
has drafter && stage drafter python3 tools/train/train_drafter.py "${SM[@]}" "${DRAFTER_STEPS[@]}" \
  --target "$TARGET_DIR" --out "$DRAFTER_DIR"
if has measure; then
  # the reference loop runs on the CPU (draft_block); two processes share the prompts
  stage measure bash -c "
    OMP_NUM_THREADS=1 python3 tools/train/measure.py --mode reference --target '$TARGET_DIR' \
      --drafter '$DRAFTER_DIR' ${MEASURE[*]} --shard 0/2 & p0=\$!
    OMP_NUM_THREADS=1 python3 tools/train/measure.py --mode reference --target '$TARGET_DIR' \
      --drafter '$DRAFTER_DIR' ${MEASURE[*]} --shard 1/2 & p1=\$!
    wait \$p0 && wait \$p1
    python3 tools/train/measure.py --mode fast --target '$TARGET_DIR' --drafter '$DRAFTER_DIR' ${MEASURE[*]}
    python3 tools/train/summarize.py"
fi
