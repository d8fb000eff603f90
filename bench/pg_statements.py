#!/usr/bin/env python3
"""What a new PostgreSQL session's statements cost the server (figures in bench/README.md):
each variant of dlock's holder-record statement, run N times on a fresh session right after
the session's first statement (as `dlock run` sends them), timed by the server itself
(`log_min_duration_statement = 0`, read back from its log), medians in ms.

Usage: bench/pg_statements.py HOST PORT LOGFILE [N]
  Needs a superuser (trust or PGPASSWORD) and the server's stderr log at LOGFILE; sets
  log_min_duration_statement with ALTER SYSTEM and resets it at the end. Writes into
  dlock_fences, dlock_holders and dlock_runs (dlock creates them; key 'pg-statements').
"""
import re
import statistics
import subprocess
import sys

ID = "-8305279116679067310"
FLOOR = "'-9223372036854775808'::bigint"
FENCE = (f"WITH f AS (INSERT INTO dlock_fences (id, fence) VALUES ({ID}, "
         f"greatest((extract(epoch FROM clock_timestamp()) * 1000000)::bigint, "
         f"(SELECT fence + 1 FROM dlock_fences WHERE id = {FLOOR}))) ON CONFLICT (id) DO UPDATE "
         f"SET fence = greatest(dlock_fences.fence + 1, EXCLUDED.fence) RETURNING fence)")
HOLDER = (f", h AS (INSERT INTO dlock_holders (pid, id, key, fence, holder) SELECT "
          f"pg_backend_pid(), {ID}, 'pg-statements', f.fence, '{{}}' FROM f ON CONFLICT (pid) "
          f"DO UPDATE SET id = EXCLUDED.id, key = EXCLUDED.key, fence = EXCLUDED.fence, "
          f"holder = EXCLUDED.holder)")
START = (", s AS (INSERT INTO dlock_runs (key, kind, at, body) SELECT 'pg-statements', 'start', "
         "now(), left('{\"a\":1}', -1) || ',\"token\":' || f.fence::text || '}' FROM f WHERE true)")
UPTIME = ", floor(extract(epoch FROM now() - pg_postmaster_start_time()))::bigint"
OTHERS = (", (SELECT json_agg(json_build_array(o.pid, CASE WHEN octet_length(o.holder) <= 65536 "
          "THEN o.holder ELSE '' END))::text FROM (SELECT pid, holder FROM dlock_holders WHERE "
          "key = 'pg-statements' AND pid <> pg_backend_pid() LIMIT 128) o)")
VARIANTS = {
    "record + start (dlock, history on)": FENCE + HOLDER + START + " SELECT fence" + UPTIME + OTHERS + ", true FROM f",
    "record (dlock, --no-history)": FENCE + HOLDER + " SELECT fence" + UPTIME + OTHERS + ", true FROM f",
    "record + start, no holder listing": FENCE + HOLDER + START + " SELECT fence" + UPTIME + ", true FROM f",
    "fence upsert alone": FENCE + " SELECT fence FROM f",
    "fence + holder upserts": FENCE + HOLDER + " SELECT fence FROM f",
    "a first read of dlock_fences": "SELECT fence FROM dlock_fences WHERE id = 1",
    "the fence's clock expression": "SELECT greatest((extract(epoch FROM clock_timestamp()) * 1000000)::bigint, 5)",
    "greatest() of two bigints": "SELECT greatest(1::bigint, 2::bigint)",
    "the start's insert alone": "INSERT INTO dlock_runs (key, kind, at, body) VALUES ('pg-statements', 'start', now(), '{}')",
    "SELECT 1": "SELECT 1",
}
CLOCK = ("greatest((extract(epoch FROM clock_timestamp()) * 1000000)::bigint, (SELECT fence + 1 "
         f"FROM dlock_fences WHERE id = {FLOOR}))")
EXISTS = (", EXISTS (SELECT FROM dlock_holders WHERE key = 'pg-statements' "
          "AND pid <> pg_backend_pid())")
# What client-side trims of the record could save, and what one table's upsert costs at least.
VARIANTS.update({
    "record + start, EXISTS for the holders' listing": FENCE + HOLDER + START + " SELECT fence" + UPTIME + EXISTS + ", true FROM f",
    "record + start, no clock": FENCE.replace(CLOCK, "7::bigint") + HOLDER + START + " SELECT fence" + UPTIME + OTHERS + ", true FROM f",
    "fence upsert alone, no clock": FENCE.replace(CLOCK, "7::bigint") + " SELECT fence FROM f",
    "fence update alone, no clock": f"UPDATE dlock_fences SET fence = fence + 1 WHERE id = {ID} RETURNING fence",
})
assert CLOCK in FENCE
FIRST = f"SET idle_session_timeout = '30s'; SELECT pg_is_in_recovery(), pg_try_advisory_lock({ID})"
DURATION = re.compile(r"duration: ([\d.]+) ms")


def main():
    host, port, log = sys.argv[1], sys.argv[2], sys.argv[3]
    n = int(sys.argv[4]) if len(sys.argv) > 4 else 20
    psql = ["psql", "-X", "-q", "-h", host, "-p", port, "-U", "postgres"]
    subprocess.run(psql + ["-c", "ALTER SYSTEM SET log_min_duration_statement = 0",
                           "-c", "SELECT pg_reload_conf()"], check=True, stdout=subprocess.DEVNULL)
    times = {k: [] for k in VARIANTS}
    try:
        for _ in range(n):
            for name, sql in VARIANTS.items():
                with open(log) as f:
                    f.seek(0, 2)
                    subprocess.run(psql + ["-c", FIRST, "-c", sql], check=True,
                                   stdout=subprocess.DEVNULL)
                    found = DURATION.findall(f.read())
                if found:
                    times[name].append(float(found[-1]))
    finally:
        subprocess.run(psql + ["-c", "ALTER SYSTEM RESET log_min_duration_statement",
                               "-c", "SELECT pg_reload_conf()"], stdout=subprocess.DEVNULL)
    for name, t in times.items():
        if t:
            print(f"{statistics.median(t):7.3f} ms  {name}  ({len(t)} sessions)")


if __name__ == "__main__":
    main()
