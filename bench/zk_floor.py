#!/usr/bin/env python3
"""The ZooKeeper server's own cost of what a run's history adds to its lock's requests, timed
with a minimal client (raw protocol, one session, one request in flight at a time): the lock
node's create alone against the `multi` that also creates the start event, the delete alone
against the `multi` that also creates the end event, and the listing of a key's queue alone
against it plus the listing of a history of 200 events (sent behind it, as dlock does).

Usage: bench/zk_floor.py HOST:PORT [ROUNDS]   (nodes under /zkfloor-PID, removed at the end)
Prints each request's median (ms) and the median paired difference per round.
"""
import os
import socket
import statistics
import struct
import sys
import time

OPEN_ACL = struct.pack(">i", 1) + struct.pack(">i", 31) + b"".join(
    struct.pack(">i", len(s)) + s for s in (b"world", b"anyone"))


def s(x):
    b = x.encode()
    return struct.pack(">i", len(b)) + b


def buf(b):
    return struct.pack(">i", len(b)) + b


class Zk:
    def __init__(self, addr):
        host, port = addr.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.xid = 0
        connect = struct.pack(">iqiq", 0, 0, 10000, 0) + buf(b"\0" * 16) + b"\0"
        self.send(connect)
        self.recv()

    def send(self, body):
        self.sock.sendall(struct.pack(">i", len(body)) + body)

    def recv(self):
        n = struct.unpack(">i", self.read(4))[0]
        return self.read(n)

    def read(self, n):
        out = b""
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise SystemExit("the server closed the connection")
            out += chunk
        return out

    def call(self, op, body):
        self.xid += 1
        self.send(struct.pack(">ii", self.xid, op) + body)
        reply = self.recv()
        _, _, err = struct.unpack(">iqi", reply[:16])
        return err, reply[16:]

    def pipelined(self, requests):
        """Sends every (op, body), then reads every reply: one round trip."""
        out = b""
        for op, body in requests:
            self.xid += 1
            req = struct.pack(">ii", self.xid, op) + body
            out += struct.pack(">i", len(req)) + req
        self.sock.sendall(out)
        return [self.recv() for _ in requests]


def create(path, data, flags):
    return s(path) + buf(data) + OPEN_ACL + struct.pack(">i", flags)


def created_path(reply):
    n = struct.unpack(">i", reply[:4])[0]
    return reply[4:4 + n].decode()


def multi(ops):
    body = b""
    for op, b in ops:
        body += struct.pack(">i?i", op, False, -1) + b
    return body + struct.pack(">i?i", -1, True, -1)


def multi_paths(reply):
    """The created paths in a multi's reply (errors raise)."""
    paths, at = [], 0
    while True:
        op, done, err = struct.unpack(">i?i", reply[at:at + 9])
        at += 9
        if done:
            return paths
        if op == -1:
            raise SystemExit(f"multi failed: {err}")
        if op == 1:
            n = struct.unpack(">i", reply[at:at + 4])[0]
            paths.append(reply[at + 4:at + 4 + n].decode())
            at += 4 + n
        elif op == 15:
            n = struct.unpack(">i", reply[at:at + 4])[0]
            paths.append(reply[at + 4:at + 4 + n].decode())
            at += 4 + n + 68  # and its stat
        # delete: nothing more


def main():
    zk = Zk(sys.argv[1])
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 300
    root = f"/zkfloor-{os.getpid()}"
    for p in (root, root + "/k", root + "/h", root + "/h200"):
        zk.call(1, create(p, b"", 0))
    for i in range(200):
        zk.call(1, create(root + "/h200/e-", b"x" * 300, 2))
    meta = b"x" * 250
    event = b"y" * 300
    t = {k: [] for k in ("create", "multi create+start", "delete", "multi end+delete",
                         "list queue", "list queue + history(200)")}

    def timed(name, f):
        a = time.perf_counter()
        r = f()
        t[name].append((time.perf_counter() - a) * 1000)
        return r

    for i in range(rounds):
        err, r = timed("create", lambda: zk.call(1, create(root + "/k/_c_x-lock-", meta, 3)))
        node = created_path(r)
        timed("list queue", lambda: zk.pipelined([(8, s(root + "/k") + b"\0")]))
        timed("list queue + history(200)", lambda: zk.pipelined(
            [(8, s(root + "/k") + b"\0"), (8, s(root + "/h200") + b"\0")]))
        timed("delete", lambda: zk.call(2, s(node) + struct.pack(">i", -1)))
        err, r = timed("multi create+start", lambda: zk.call(14, multi(
            [(15, create(root + "/k/_c_x-lock-", meta, 3)), (15, create(root + "/h/e-", event, 2))])))
        node, start = multi_paths(r)
        err, r = timed("multi end+delete", lambda: zk.call(14, multi(
            [(15, create(root + "/h/e-", event, 2)), (2, s(node) + struct.pack(">i", -1))])))
        end = multi_paths(r)[0]
        for p in (start, end):
            zk.call(2, s(p) + struct.pack(">i", -1))
    med = {k: statistics.median(v) for k, v in t.items()}
    for k, v in med.items():
        print(f"{v:7.3f} ms  {k}")
    for a, b in (("create", "multi create+start"), ("delete", "multi end+delete"),
                 ("list queue", "list queue + history(200)")):
        d = statistics.median(y - x for x, y in zip(t[a], t[b]))
        print(f"median paired difference ({b} - {a}): {d:+.3f} ms")
    for parent in (root + "/h200", root + "/h", root + "/k"):
        _, r = zk.call(8, s(parent) + b"\0")
        count, at = struct.unpack(">i", r[:4])[0], 4
        for _ in range(count):
            n = struct.unpack(">i", r[at:at + 4])[0]
            zk.call(2, s(parent + "/" + r[at + 4:at + 4 + n].decode()) + struct.pack(">i", -1))
            at += 4 + n
        zk.call(2, s(parent) + struct.pack(">i", -1))
    zk.call(2, s(root) + struct.pack(">i", -1))


if __name__ == "__main__":
    main()
