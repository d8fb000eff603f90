"""A test helper: takes one of kazoo's lock recipes on a ZooKeeper path, for the interop tests
(tests/it/interop.rs). Not part of dlock. Same actions as Recipes.java:

    kazoo_recipes.py <hosts> <path> <recipe> hold <marker> | try | count <file> <n>

<recipe>: lock (kazoo's defaults) | lock-dlock (extra_lock_patterns=["-lock-"], which sees
dlock's and Curator's nodes) | rlock | semaphore (2 leases)
"""

import sys
import time

from kazoo.client import KazooClient


def recipe(zk, path, name):
    if name == "lock":
        return zk.Lock(path)
    if name == "lock-dlock":
        return zk.Lock(path, extra_lock_patterns=["-lock-"])
    if name == "rlock":
        return zk.ReadLock(path)
    if name == "semaphore":
        return zk.Semaphore(path, max_leases=2)
    raise ValueError(name)


def main(hosts, path, name, action, *rest):
    zk = KazooClient(hosts=hosts, timeout=10)
    zk.start()
    code = 0
    if action == "hold":
        lock = recipe(zk, path, name)
        lock.acquire()
        with open(rest[0], "w") as f:
            f.write("held\n")
        sys.stdin.read()
        lock.release()
    elif action == "try":
        lock = recipe(zk, path, name)
        if lock.acquire(blocking=False):
            lock.release()
        else:
            code = 1
    elif action == "count":
        for _ in range(int(rest[1])):
            lock = recipe(zk, path, name)
            with lock:
                with open(rest[0]) as f:
                    n = int(f.read())
                time.sleep(0.005)
                with open(rest[0], "w") as f:
                    f.write("%d\n" % (n + 1))
    else:
        raise ValueError(action)
    zk.stop()
    zk.close()
    return code


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
