#!/usr/bin/env bash
# Whole-process benchmarks of `dlock run` (figures in bench/README.md):
#   1. uncontended overhead: `dlock run -- true` against `flock FILE true` (hyperfine medians);
#   2. contention: 8 loops x 25 runs on one key against the same 200 runs one after another.
# Usage: bench/run.sh [dlock backend options...]     e.g. bench/run.sh --backend redis --url redis://127.0.0.1:6379
# Needs hyperfine (apt-get install hyperfine). Builds the release binary first.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet
dlock="$PWD/target/release/dlock"
backend=("$@")
runs=${RUNS:-2000}
key="bench-$$"
lockfile=$(mktemp)
json=$(mktemp)
trap 'rm -f "$lockfile" "$json"' EXIT

echo "== uncontended: median of $runs runs (hyperfine -N)"
hyperfine -N --warmup 100 --runs "$runs" --export-json "$json" \
  "flock $lockfile true" "$dlock run ${backend[*]} -k $key -- true" >/dev/null
python3 - "$json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["results"]
base = r[0]["median"]
for x in r:
    print(f"  {x['median']*1000:7.3f} ms median  {x['median']/base:5.2f}x  {x['command']}")
PY

loops=8 per=25
echo "== contention: $loops loops x $per runs on one key vs $((loops * per)) serial runs"
start=$(date +%s.%N)
for _ in $(seq $((loops * per))); do "$dlock" run "${backend[@]}" -k "$key" -- true; done
serial=$(echo "$(date +%s.%N) - $start" | bc)
start=$(date +%s.%N)
for _ in $(seq $loops); do
  ( for _ in $(seq $per); do "$dlock" run "${backend[@]}" -k "$key" --wait 60s -- true; done ) &
done
wait
contended=$(echo "$(date +%s.%N) - $start" | bc)
printf '  serial    %6.3f s\n  contended %6.3f s  (%.2fx serial)\n' "$serial" "$contended" "$(echo "$contended / $serial" | bc -l)"
