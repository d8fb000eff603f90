#!/usr/bin/env python3
"""Where a contended hand-off's time goes (figures in bench/README.md): LOOPS loops of RUNS
runs each of `DLOCK run ARGS -k KEY --wait 60s -- sleep 0.02` on one key, every run traced
(DLOCK_TRACE=stages), then, for each run and the run after it on the key, the medians of: the
holder's release (from seeing its command's end), the next run's lock (from that release),
its guardian and its command's spawn, and the whole hand-off — from one command's end seen
to the next command executed.

Usage: bench/handoff.py DLOCK [LOOPS RUNS] -- BACKEND ARGS...
  e.g. bench/handoff.py target/release/dlock -- -u redis://127.0.0.1:6379
"""
import os
import re
import statistics
import subprocess
import sys
import tempfile

LINE = re.compile(r"^dlock: stage (\S+) \d+ us \(at (\d+)\)$")


def main():
    args = sys.argv[1:]
    cut = args.index("--") if "--" in args else 0
    if cut == 0 or cut == 2 or cut > 3:
        sys.exit(__doc__)
    head, backend = args[:cut], args[cut + 1:]
    dlock = head[0]
    loops, runs = (int(head[1]), int(head[2])) if len(head) >= 3 else (8, 25)
    key = f"handoff-{os.getpid()}"
    env = dict(os.environ, DLOCK_TRACE="stages")
    with tempfile.TemporaryDirectory() as d:
        cmd = [dlock, "run", *backend, "-k", key, "--wait", "60s", "--", "sleep", "0.02"]
        script = 'for _ in $(seq "$1"); do "${@:3}" 2>>"$2"; done'
        procs = [subprocess.Popen(["bash", "-c", script, "loop", str(runs), f"{d}/loop{i}", *cmd],
                                  env=env) for i in range(loops)]
        for p in procs:
            p.wait()
        traced = []
        for i in range(loops):
            cur = None
            for line in open(f"{d}/loop{i}"):
                m = LINE.match(line.strip())
                if not m:
                    continue
                if m.group(1) == "start":
                    cur = {}
                    traced.append(cur)
                cur[m.group(1)] = int(m.group(2))
    done = sorted((r for r in traced if {"lock", "spawn", "command", "release"} <= r.keys()),
                  key=lambda r: r["spawn"])
    parts = {}
    for a, b in zip(done, done[1:]):
        for name, v in [("holder: command's end seen -> released", a["release"] - a["command"]),
                        ("next: released -> locked", b["lock"] - a["release"]),
                        ("next: locked -> guardian started", b["guardian"] - b["lock"]),
                        ("next: guardian -> command executed", b["spawn"] - b["guardian"]),
                        ("hand-off: command's end seen -> next executed", b["spawn"] - a["command"])]:
            parts.setdefault(name, []).append(v)
    print(f"# {len(done)} runs of {loops} loops on one key: median / p90, µs")
    for name, v in parts.items():
        v.sort()
        print(f"  {name:48s} {statistics.median(v):6.0f} / {v[len(v) * 9 // 10]:6.0f}")


if __name__ == "__main__":
    main()
