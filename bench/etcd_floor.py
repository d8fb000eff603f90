#!/usr/bin/env python3
"""The etcd server's floor per lock (figures in bench/README.md): lease grant, the create
transaction and revoke, timed one by one in one warm client, N cycles, medians; and the CPU
the etcd process spent on them (from /proc, when its pid is given).

Usage: bench/etcd_floor.py HOST:PORT [N] [--new] [--grpc] [--pid ETCD_PID]
  --new   a new connection per cycle (as each `dlock run` process has)
  --grpc  gRPC through the `etcd3` package (pip install etcd3) instead of the JSON gateway
"""
import base64
import http.client
import json
import statistics
import sys
import time


def gateway(host, port, new):
    conn = [http.client.HTTPConnection(host, port)]

    def call(path, body):
        conn[0].request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        return json.loads(conn[0].getresponse().read() or b"null")

    b64 = lambda s: base64.b64encode(s.encode()).decode()

    def cycle():
        if new:
            conn[0].close()
            conn[0] = http.client.HTTPConnection(host, port)
        t = [time.perf_counter()]
        lease = call("/v3/lease/grant", {"TTL": "30"})["ID"]
        t.append(time.perf_counter())
        key = b64("dlock-floor/x/" + lease)
        call("/v3/kv/txn", {
            "compare": [{"key": key, "target": "CREATE", "result": "EQUAL", "create_revision": "0"}],
            "success": [{"request_put": {"key": key, "value": b64("{}"), "lease": lease}}],
        })
        t.append(time.perf_counter())
        call("/v3/lease/revoke", {"ID": lease})
        t.append(time.perf_counter())
        return t

    return cycle


def grpc(host, port):
    import etcd3

    c = etcd3.client(host=host, port=port)

    def cycle():
        t = [time.perf_counter()]
        lease = c.lease(30)
        t.append(time.perf_counter())
        key = "dlock-floor/x/%x" % lease.id
        c.transaction(compare=[c.transactions.create(key) == 0],
                      success=[c.transactions.put(key, "{}", lease=lease)], failure=[])
        t.append(time.perf_counter())
        lease.revoke()
        t.append(time.perf_counter())
        return t

    return cycle


def cpu(pid):
    if pid is None:
        return 0.0
    f = open(f"/proc/{pid}/stat").read().rsplit(") ", 1)[1].split()
    return (int(f[11]) + int(f[12])) / 100.0


def main():
    args = sys.argv[1:]
    pid = None
    if "--pid" in args:
        i = args.index("--pid")
        pid = int(args[i + 1])
        del args[i:i + 2]
    host, port = args[0].rsplit(":", 1)
    n = int(args[1]) if len(args) > 1 and not args[1].startswith("--") else 300
    cycle = grpc(host, int(port)) if "--grpc" in args else gateway(host, int(port), "--new" in args)
    steps = {"grant": [], "create": [], "revoke": []}
    cpu0 = cpu(pid)
    for _ in range(n):
        t = cycle()
        for (name, v), a, b in zip(steps.items(), t, t[1:]):
            v.append(b - a)
    used = cpu(pid) - cpu0
    total = 0.0
    for name, v in steps.items():
        m = statistics.median(v)
        total += m
        print(f"  {name:7} median {m * 1000:5.2f} ms")
    print(f"  per lock {total * 1000:5.2f} ms (sum of medians)")
    if pid is not None:
        print(f"  etcd CPU {used:.2f} s for {n} locks ({used / n * 1000:.1f} ms a lock)")


main()
