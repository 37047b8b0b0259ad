#!/usr/bin/env bash
# Builds every fuzz target and runs each for N seconds (default 20) over a scratch copy
# of its seed corpus (fuzz/corpus/TARGET), so runs never grow the committed corpora.
# Exits non-zero when a target crashes, fails an assertion or hangs, naming the input
# (kept under fuzz/artifacts/TARGET/). Stable Rust: libFuzzer without a sanitizer.
#
#   bash fuzz/run.sh [seconds-per-target] [target...]
#
# FUZZ_JOBS targets run at once (default: the number of cores).
set -euo pipefail
cd "$(dirname "$0")/.."

secs=${1:-20}
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=(heartbeat registration commit_request app_spec control_json autoscaling pool artifact_wire)
fi
jobs=${FUZZ_JOBS:-$(nproc)}

export CARGO_TERM_COLOR=never
if ! cargo fuzz --version >/dev/null 2>&1; then
  cargo install cargo-fuzz --locked
fi

cargo fmt --manifest-path fuzz/Cargo.toml -- --check
host=$(rustc -vV | sed -n 's/^host: //p')
started=$(date +%s)
# Optimised, with debug assertions and overflow checks; no sanitizer needs nightly.
cargo fuzz build --sanitizer none --release --debug-assertions --target "$host"
echo "fuzz: built in $(($(date +%s) - started)) s"
bin="${CARGO_TARGET_DIR:-fuzz/target}/$host/release"

scratch=fuzz/scratch
rm -rf "$scratch"
mkdir -p "$scratch"

run_one() {
  local t=$1
  mkdir -p "$scratch/$t" "fuzz/artifacts/$t"
  cp fuzz/corpus/"$t"/* "$scratch/$t/"
  # -timeout: an input taking longer counts as a hang (a failure).
  "$bin/$t" "$scratch/$t" -max_total_time="$secs" -timeout=10 -print_final_stats=1 \
    -artifact_prefix="fuzz/artifacts/$t/" >"$scratch/$t.log" 2>&1
}

pids=()
names=()
failed=()
for t in "${targets[@]}"; do
  if [ ! -x "$bin/$t" ]; then
    echo "fuzz: no target $t" >&2
    exit 2
  fi
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do
    sleep 1
  done
  run_one "$t" &
  pids+=($!)
  names+=("$t")
done
for i in "${!pids[@]}"; do
  t=${names[$i]}
  if wait "${pids[$i]}"; then
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$scratch/$t.log")
    cov=$(grep -oE 'cov: [0-9]+' "$scratch/$t.log" | tail -1)
    echo "fuzz: $t ok (${runs:-?} runs in $secs s, $cov)"
  else
    failed+=("$t")
    echo "fuzz: $t FAILED; the end of its log ($scratch/$t.log):"
    tail -n 40 "$scratch/$t.log"
    grep -h -A3 'panicked at' "$scratch/$t.log" | head -n 20 || true
    grep -hoE 'Test unit written to [^ ]+' "$scratch/$t.log" | sed 's/^Test unit written to /fuzz: crashing input: /' || true
  fi
done

echo "fuzz: built and ran in $(($(date +%s) - started)) s"
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: failed: ${failed[*]}; reproduce with $bin/TARGET INPUT, or with"
  echo "fuzz: cargo test --manifest-path fuzz/Cargo.toml (it replays fuzz/artifacts too)"
fi
echo "fuzz: $((${#targets[@]} - ${#failed[@]})) passed, ${#failed[@]} failed"
[ ${#failed[@]} -eq 0 ]
