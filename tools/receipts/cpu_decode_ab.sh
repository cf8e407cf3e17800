#!/usr/bin/env bash
# CPU one-stream decode A/B of two tensorfold binaries in one sitting: the default pair and LFM2-8B-A1B's layer plan
# at hidden 512 (bf16, MLX 4-bit and 8-bit, written by `tensorfold synth`), `bench forward` (512-token prompt, 64
# decode steps, token hashes printed) and a short-prompt `generate`, A B B A, at 2 threads and 1.
#   tools/receipts/cpu_decode_ab.sh A_BIN B_BIN OUT   (THREADS: the thread counts, default "2 1")
# Writes OUT/NAME-THREADS-WHO-N.{txt,json}, OUT/models/ and OUT/run.log (load average at each run's start).
set -euo pipefail
cd "$(dirname "$0")/../.."
a=$1 b=$2 out=$3
mkdir -p "$out/models"
# The 8B plan at hidden 512 (the shape of tools/peers/make_random_checkpoint.py), with mlx-lm's quantization block
# (group 64, routers at 8 bits) for the affine forms.
python3 - "$out/models" <<'EOF'
import json, os, sys
root = sys.argv[1]
c = json.load(open("crates/tensorfold-model/src/shapes/lfm2-8b-a1b.json"))
c.pop("_comment")
c.update(hidden_size=512, num_attention_heads=8, num_key_value_heads=2, intermediate_size=1792,
         moe_intermediate_size=256)
for name, bits in [("bf16", None), ("mlx4", 4), ("mlx8", 8)]:
    d = dict(c)
    if bits:
        q = {"group_size": 64, "bits": bits, "mode": "affine"}
        for i in range(c["num_dense_layers"], c["num_hidden_layers"]):
            q[f"model.layers.{i}.feed_forward.gate"] = {"group_size": 64, "bits": 8}
        d["quantization"] = d["quantization_config"] = q
    os.makedirs(f"{root}/{name}-config", exist_ok=True)
    json.dump(d, open(f"{root}/{name}-config/config.json", "w"), indent=1)
EOF
for m in bf16 mlx4 mlx8; do
    [ -f "$out/models/8b-$m/model.safetensors" ] ||
        "$a" synth "$out/models/$m-config/config.json" --out "$out/models/8b-$m" | tail -n 1
done
log="$out/run.log"
echo "A $a ($(sha256sum "$a" | cut -c1-12))  B $b ($(sha256sum "$b" | cut -c1-12))  $(date -u)" | tee -a "$log"
n=0
for threads in ${THREADS:-2 1}; do
    for m in default 8b-bf16 8b-mlx4 8b-mlx8; do
        model=()
        [ "$m" = default ] || model=(--model "$out/models/$m")
        for who in A B B A; do
            n=$((n + 1))
            bin=$a; [ "$who" = B ] && bin=$b
            f="$out/$m-t$threads-$who-$n"
            echo "$n $m t$threads $who load $(cut -d' ' -f1 /proc/loadavg)" | tee -a "$log"
            "$bin" bench forward "${model[@]}" --prompt-lens 512 --decode 64 --threads "$threads" \
                --json "$f.json" >"$f.txt" 2>&1
            grep -E "token_sha256|decode " "$f.txt" | sed 's/^/    /' | tee -a "$log"
            "$bin" generate "${model[@]}" --prompt-ids 1,2,3 --max-tokens 256 --ignore-eos --temperature 0 \
                --threads "$threads" --no-drafts >"$f-short.txt" 2>&1
            grep -E "token_sha256|tok/s" "$f-short.txt" | sed 's/^/    /' | tee -a "$log"
        done
    done
done
echo "end load $(cut -d' ' -f1 /proc/loadavg) $(date -u)" | tee -a "$log"
