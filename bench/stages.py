#!/usr/bin/env python3
"""Where a run's time goes: runs a dlock command RUNS times with DLOCK_TRACE=stages and prints
the median of each stage (docs/design.md, "Where the time goes").

Usage: bench/stages.py RUNS 'DLOCK run ... -- /bin/true' ['OTHER DLOCK COMMAND' ...]
       (several commands: interleaved run by run, one column each)

Besides dlock's own stages it times, from outside, `exec` — from posix_spawn until dlock's
`main` starts (the kernel's exec, the loader, relocations) — and `exit` — from dlock's last
stage until waitpid returns. Times are CLOCK_BOOTTIME, as dlock's. The total is the whole run
as the caller sees it.
"""
import os
import re
import shlex
import statistics
import sys
import time

LINE = re.compile(rb"^dlock: stage (\S+) (\d+) us \(at (\d+)\)$")


def once(cmd):
    r, w = os.pipe()
    devnull = os.open(os.devnull, os.O_WRONLY)
    env = dict(os.environ, DLOCK_TRACE="stages")
    actions = [(os.POSIX_SPAWN_DUP2, devnull, 1), (os.POSIX_SPAWN_DUP2, w, 2)]
    t0 = time.clock_gettime_ns(time.CLOCK_BOOTTIME) // 1000
    pid = os.posix_spawn(cmd[0], cmd, env, file_actions=actions)
    os.close(w)
    os.close(devnull)
    _, status = os.waitpid(pid, 0)
    t1 = time.clock_gettime_ns(time.CLOCK_BOOTTIME) // 1000
    err = b""
    while chunk := os.read(r, 65536):
        err += chunk
    os.close(r)
    if status != 0:
        sys.exit(f"{shlex.join(cmd)}: failed (wait status {status}): {err.decode(errors='replace')}")
    stages = {}
    last = t0
    for line in err.splitlines():
        m = LINE.match(line)
        if not m:
            continue
        name, at = m.group(1).decode(), int(m.group(3))
        stages["exec" if name == "start" else name] = at - last
        last = at
    if not stages:
        sys.exit(f"{shlex.join(cmd)}: no stages on stderr (a dlock without DLOCK_TRACE?)")
    stages["exit"] = t1 - last
    stages["total"] = t1 - t0
    return stages


def main():
    runs = int(sys.argv[1])
    cmds = [shlex.split(c) for c in sys.argv[2:]]
    seen = [[] for _ in cmds]
    for i in range(runs):
        order = range(len(cmds)) if i % 2 == 0 else reversed(range(len(cmds)))
        for k in order:
            seen[k].append(once(cmds[k]))
    names = ["exec", "parse", "setup", "connect", "lock", "history", "guardian", "spawn", "command",
             "release", "done", "exit"]
    for runs_of in seen:
        for s in runs_of:
            for n in s:
                if n not in names and n != "total":
                    names.append(n)
    names = [n for n in names if any(n in s for r in seen for s in r)] + ["total"]
    print(f"{'stage (median µs)':<18}" + "".join(f"{'#' + str(k + 1):>9}" for k in range(len(cmds))))
    for n in names:
        row = f"{n:<18}"
        for runs_of in seen:
            vals = [s[n] for s in runs_of if n in s]
            row += f"{statistics.median(vals):9.0f}" if vals else f"{'-':>9}"
        print(row)
    for k, c in enumerate(sys.argv[2:]):
        print(f"#{k + 1}: {c}")


if __name__ == "__main__":
    main()
