#!/usr/bin/env python3
"""FUSE requests per opcode, per mount session, from the kernel's fuse tracepoints.

Two modes (used by scripts/fuse-requests):
  poll MOUNTINFO_OUT [PREFIX]   record FUSE mounts (device, source, mountpoint, monotonic
                                time) as they appear, every 10 ms, until killed
  report PERF_SCRIPT_TXT MOUNTS print, for every mount session (from one FUSE_INIT to the
                                next on a connection), each opcode's count, summed and mean
                                latency (send -> end: queueing + daemon + reply) and errors

Why tracepoints: fuse:fuse_request_send/end see every request of every FUSE file system the
same way (fernfs, null-fuse), so the two can be compared without instrumenting either; the
connection number is the mount's anonymous device minor, which /proc/self/mountinfo names.
"""
import collections
import re
import sys
import time


def poll(out, prefix):
    seen = {}
    with open(out, "w") as f:
        while True:
            now = time.monotonic()
            try:
                lines = open("/proc/self/mountinfo").read().splitlines()
            except OSError:
                lines = []
            cur = set()
            for line in lines:
                p = line.split()
                sep = p.index("-")
                if not p[sep + 1].startswith("fuse") or not p[4].startswith(prefix):
                    continue
                key = (p[2], p[4])
                cur.add(key)
                if key not in seen:
                    seen[key] = now
                    f.write(f"{now:.6f} add {p[2]} {p[sep + 2]} {p[4]}\n")
                    f.flush()
            for key in [k for k in seen if k not in cur]:
                f.write(f"{now:.6f} del {key[0]} {key[1]}\n")
                f.flush()
                del seen[key]
            time.sleep(0.01)


RX = re.compile(
    r"^\s*(\d+\.\d+):\s+fuse:fuse_request_(send|end):\s+connection (\d+) req (\d+)"
    r"(?: opcode \d+ \((\w+)\))?.*?(?:error (-?\d+))?\s*$"
)


def report(perf_txt, mounts_txt):
    mounts = []
    for line in open(mounts_txt):
        p = line.split()
        if p[1] == "add":
            mounts.append((float(p[0]), int(p[2].split(":")[1]), p[3], p[4]))
    sessions = collections.OrderedDict()
    cur, pending = {}, {}
    for line in open(perf_txt):
        m = RX.search(line)
        if not m:
            continue
        t, kind, conn, uniq, op, err = float(m[1]), m[2], int(m[3]) & 0xFFFFF, m[4], m[5], m[6]
        if kind == "send":
            if op == "FUSE_INIT" or conn not in cur:
                cur[conn] = (conn, t)
                sessions[cur[conn]] = {
                    "n": collections.Counter(),
                    "lat": collections.Counter(),
                    "err": collections.Counter(),
                    "t1": t,
                }
            s = sessions[cur[conn]]
            s["n"][op] += 1
            s["t1"] = t
            pending[(conn, uniq)] = (t, op)
        else:
            sent = pending.pop((conn, uniq), None)
            if sent and conn in cur:
                s = sessions[cur[conn]]
                s["lat"][sent[1]] += t - sent[0]
                if err and int(err) != 0:
                    s["err"][(sent[1], int(err))] += 1
    for (minor, t0), s in sessions.items():
        near = [m for m in mounts if m[1] == minor and abs(m[0] - t0) < 3]
        if not near:
            continue
        src, mnt = min(near, key=lambda m: abs(m[0] - t0))[2:]
        total = sum(s["n"].values())
        print(f"== {src} on {mnt} (0:{minor}): {total} requests over {s['t1'] - t0:.3f} s")
        for op, c in s["n"].most_common():
            lat = s["lat"][op]
            print(f"   {op:22s} {c:8d}  sum {lat * 1e3:9.1f} ms  mean {lat / c * 1e6:8.1f} us")
        for (op, e), c in s["err"].most_common(8):
            print(f"   errors {op} {e}: {c}")


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "poll":
        poll(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "/")
    elif len(sys.argv) == 4 and sys.argv[1] == "report":
        report(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
