#!/usr/bin/env bash
# Queues of waiters on one key (figures in bench/README.md). For 10, 50 and 100 waiters queued behind
# a holder: the CPU the idle waiters use in 5 s, the holder's peak RSS, and the server commands
# per hand-off once the holder lets go (each waiter then takes the lock once).
# Usage: COUNT='command printing the server's command counter' bench/waiters.sh [dlock backend options...]
#   redis:     COUNT="redis-cli -p 6379 INFO stats | sed -n 's/^total_commands_processed://p'"
#   mysql:     COUNT="mariadb -N -B -uroot -e \"SHOW GLOBAL STATUS LIKE 'Questions'\" | cut -f2"
#   zookeeper: COUNT="exec 3<>/dev/tcp/127.0.0.1/2181; printf mntr >&3; timeout 5 cat <&3 | sed -n 's/^zk_packets_received\t//p'"
#   postgres:  COUNT="psql -X -h SOCKDIR -p PORT -U postgres -Atc 'SELECT sum(xact_commit + xact_rollback) FROM pg_stat_database'"
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet
dlock="$PWD/target/release/dlock"
backend=("$@")
tmp=$(mktemp -d)
trap 'touch "$tmp/go"; rm -rf "$tmp"' EXIT
count() { bash -c "$COUNT" | tr -d '[:space:]'; }
ticks() { # utime + stime of the given pids, in clock ticks
  local t=0 p f
  for p in "$@"; do
    f=$(sed 's/.*) //' "/proc/$p/stat" 2>/dev/null) || continue
    set -- $f
    t=$((t + ${12} + ${13}))
  done
  echo $t
}
hz=$(getconf CLK_TCK)
for n in 10 50 100; do
  key="waiters-$$-$n"
  rm -f "$tmp/go"
  "$dlock" run "${backend[@]}" -k "$key" -- sh -c "while [ ! -e $tmp/go ]; do sleep 0.01; done" &
  holder=$!
  until "$dlock" status "${backend[@]}" -k "$key" --json | grep -q '"held":true'; do sleep 0.05; done
  pids=()
  for _ in $(seq "$n"); do
    "$dlock" run "${backend[@]}" -k "$key" --wait 300s -- true &
    pids+=($!)
  done
  until "$dlock" status "${backend[@]}" -k "$key" --json | grep -q "\"waiters\":$n[,}]"; do sleep 0.1; done
  t0=$(ticks "${pids[@]}")
  sleep 5
  t1=$(ticks "${pids[@]}")
  rss=$(sed -n 's/^VmHWM:\s*//p' "/proc/$holder/status")
  c0=$(count)
  touch "$tmp/go"
  wait "$holder" "${pids[@]}"
  c1=$(count)
  printf '  %3d waiters: idle CPU %4d ms in 5 s (all waiters), holder peak RSS %s, %5.1f server commands per hand-off\n' \
    "$n" $(( (t1 - t0) * 1000 / hz )) "$rss" "$(echo "($c1 - $c0) / $n" | bc -l)"
done
