"""Reads `callgrind_annotate --inclusive=yes` output of scripts/request-instructions and prints
instructions per call of fern-fs's request-level operations.

callgrind splits a function's cost by the source file of inlined code, so one function appears
on several lines; its inclusive total is the largest of them (the line of its own file)."""
import re
import sys

dirs = int(sys.argv[1])
files = dirs * 125
# Calls of each operation in the workload (see scripts/request-instructions).
calls = {
    "create": files,
    "write": files,
    "release": files,
    "setattr_as": 2 * files,
    "unlink": files,
    "mkdir": dirs + 1,
    "rmdir": dirs + 1,
}
line = re.compile(
    r" *([0-9,]+) \(.*?\)  [^:]*:fern_fs::[a-z_]+::<impl fern_fs::fs::Fs>::([a-z_]+)( \[.*)?$"
)
best = {}
for text in sys.stdin:
    m = line.match(text)
    if m and m.group(2) in calls:
        v = int(m.group(1).replace(",", ""))
        best[m.group(2)] = max(best.get(m.group(2), 0), v)
print("%-12s %8s %14s" % ("operation", "calls", "instr/call"))
for op in sorted(best):
    print("%-12s %8d %14d" % (op, calls[op], best[op] // calls[op]))
