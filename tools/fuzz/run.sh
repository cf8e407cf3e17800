#!/usr/bin/env bash
# The long fuzz run (docs/fuzzing.md): every proptest fuzz property with CASES cases (default 20000) from a fresh
# seed (SEED, default the clock), printed first so a failure can be replayed with the same SEED. CI runs the same
# properties inside `cargo test` with their own small case counts from a fixed seed. A failing case is shrunk and
# saved by proptest under the crate's proptest-regressions/; make it a named regression test beside the property.
set -euo pipefail
cd "$(dirname "$0")/../.."
cases="${CASES:-20000}"
seed="${SEED:-$(date +%s)}"
echo "fuzz: ${cases} cases a property, PROPTEST_RNG_SEED=${seed}"
export PROPTEST_CASES="$cases" PROPTEST_RNG_SEED="$seed"
cargo test --release -p tensorfold-text --lib tests_fuzz
cargo test --release -p tensorfold-server --lib tests_fuzz
cargo test --release -p tensorfold-model --test fuzz_checkpoints
echo "fuzz: passed (seed ${seed})"
