#!/usr/bin/env bash
# dlock against the usual alternatives, 8 loops x 25 runs of `true` on one lock (figures in
# bench/README.md): dlock on each backend given, `flock`, `etcdctl lock` against a local etcd, and the
# hand-written Redis loop (`SET NX PX` + `sleep 0.1` until it works, then `DEL`).
# The locked command is `true`, or $CMD (e.g. CMD="sleep 0.02", a job that does some work).
# Usage: bench/compare.sh REDIS_URL ETCD_ENDPOINT [dlock backend options...]
#   e.g. bench/compare.sh redis://127.0.0.1:6379 127.0.0.1:2379 --backend redis --url redis://127.0.0.1:6379
# Needs redis-cli and etcdctl (apt-get install redis-tools etcd-client). Builds dlock first.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet
dlock="$PWD/target/release/dlock"
redis_url=$1 etcd=$2
shift 2
loops=8 per=25
read -r -a cmd <<< "${CMD:-true}"
lockfile=$(mktemp)
trap 'rm -f "$lockfile"' EXIT
key="compare-$$"

contended() { # name, command words...
  local name=$1 start end
  shift
  start=$(date +%s.%N)
  for _ in $(seq $loops); do
    ( for _ in $(seq $per); do "$@"; done ) &
  done
  wait
  end=$(date +%s.%N)
  printf '  %-36s %7.3f s\n' "$name" "$(echo "$end - $start" | bc)"
}

poll_loop() { # the hand-written Redis lock most scripts use
  until [ "$(redis-cli -u "$redis_url" SET "poll-$key" "$$" NX PX 30000)" = OK ]; do sleep 0.1; done
  "${cmd[@]}"
  redis-cli -u "$redis_url" DEL "poll-$key" >/dev/null
}

echo "== $loops loops x $per runs of '${cmd[*]}' on one lock"
contended "flock" flock "$lockfile" "${cmd[@]}"
contended "dlock $*" "$dlock" run "$@" -k "$key" --wait 60s -- "${cmd[@]}"
contended "etcdctl lock" env ETCDCTL_API=3 etcdctl --endpoints="$etcd" lock "$key" "${cmd[@]}"
contended "redis-cli SET NX + sleep 0.1 loop" poll_loop
