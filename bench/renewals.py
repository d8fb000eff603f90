#!/usr/bin/env python3
"""A renewal's cost, old build against new: each runs `run -v --ttl 600ms -- sleep 6` (a renewal
every 200 ms) in turn, ROUNDS times each, and the "renewed the lease in" lines are collected.

Usage: bench/renewals.py URL ROUNDS OLD_DLOCK NEW_DLOCK (absolute paths)
"""
import re
import statistics
import subprocess
import sys

OLD, NEW = sys.argv[3], sys.argv[4]
def samples(binary, url, key, secs):
    p = subprocess.run([binary, "run", "-v", "--ttl", "600ms", "-u", url, "-k", key, "--", "sleep", str(secs)],
                       capture_output=True, text=True)
    out = []
    for m in re.finditer(r"renewed the lease in ([0-9.]+)(ms|µs|s)", p.stderr):
        v = float(m.group(1)); u = m.group(2)
        out.append(v * {"ms": 1, "µs": 1e-3, "s": 1e3}[u])
    return out
url = sys.argv[1]
rounds = int(sys.argv[2])
res = {OLD: [], NEW: []}
for i in range(rounds):
    for b in ((OLD, NEW) if i % 2 == 0 else (NEW, OLD)):
        res[b] += samples(b, url, "renewbench", 6)
for b in (OLD, NEW):
    s = res[b]
    print(f"{'OLD' if b == OLD else 'NEW'}: {len(s)} renewals, median {statistics.median(s):.3f} ms, mean {statistics.mean(s):.3f} ms")
