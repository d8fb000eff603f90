#!/usr/bin/env python3
"""Side-by-side timing of whole commands, alternating them run by run (A B C, C B A, ...), so
that the machine's drifts hit every command alike; hyperfine runs one command's batch after the
other, and on this project's VM batches drift by +-15% and the slot in a run matters.

Usage: bench/alternate.py RUNS 'CMD1 ...' 'CMD2 ...' ['CMD3 ...' ...]
Prints each command's median (ms) and its ratio to the first; with three or more, the median of
the paired differences of the third against the second (e.g. flock, old dlock, new dlock).
Commands are split like a shell would (no shell runs them); give absolute paths.
"""
import os
import shlex
import statistics
import sys
import time


def main():
    runs = int(sys.argv[1])
    texts = sys.argv[2:]
    cmds = [shlex.split(c) for c in texts]
    devnull = os.open(os.devnull, os.O_WRONLY)
    quiet = [(os.POSIX_SPAWN_DUP2, devnull, 1), (os.POSIX_SPAWN_DUP2, devnull, 2)]
    times = [[] for _ in cmds]
    for i in range(runs):
        order = range(len(cmds)) if i % 2 == 0 else reversed(range(len(cmds)))
        for k in order:
            t = time.perf_counter()
            pid = os.posix_spawn(cmds[k][0], cmds[k], os.environ, file_actions=quiet)
            _, status = os.waitpid(pid, 0)
            times[k].append((time.perf_counter() - t) * 1000)
            if status != 0:
                sys.exit(f"{texts[k]}: failed (wait status {status})")
    base = statistics.median(times[0])
    for text, t in zip(texts, times):
        m = statistics.median(t)
        print(f"{m:7.3f} ms  {m / base:5.2f}x  {text}")
    if len(cmds) >= 3:
        d = statistics.median(b - a for a, b in zip(times[1], times[2]))
        print(f"median paired difference (3rd - 2nd): {d:+.3f} ms")


if __name__ == "__main__":
    main()
