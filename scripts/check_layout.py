#!/usr/bin/env python3
"""Checks the include structure of src/: includes run down the floors (a
directory uses itself and the floors below, never one beside or above it;
core/ uses no other directory), and no two parts include each other. A part
is a .cpp with its .hpp; a public header counts as a part of the file that
implements it. Prints each violation; exits 1 on any."""
import re
import sys
from pathlib import Path

root = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent)
src = root / "src"
# Public headers and the part that implements them.
public = {
    "collectives": "core/collectives", "datatype": "core/types", "op": "core/op", "ops.def": "core/op",
    "report": "core/report", "types.def": "core/types", "stop": "core/stop",
    "error": "core/error", "failure": "core/failure", "session": "core/session",
    "profile": "profile/profile", "shm": "backends/shm/bucket", "shm_config": "core/config", "launch": "launch/launch",
    "print": "tools/print", "stats": "tools/stats", "checkpoint": "checkpoint/checkpoint",
}
# Implemented across a directory: an interface only.
spread = {"torch"}
floors = {"core": 0, "backends/shm": 1, "backends/mpi": 1, "profile": 2, "launch": 2,
          "checkpoint": 2, "tools": 2, "torch": 3}
inc = re.compile(r'^\s*#\s*include\s+([<"])([^>"]+)[>"]', re.M)


def part(path):
    rel = path.relative_to(src).with_suffix("")
    return str(rel)


def area(p):  # core, backends/shm, torch, ...
    d = p.rsplit("/", 1)[0]
    return d


edges = {}
problems = []
for f in sorted(list(src.rglob("*.cpp")) + list(src.rglob("*.hpp"))):
    me = part(f)
    for kind, name in inc.findall(f.read_text()):
        if kind == '"':
            target = (f.parent / name) if (f.parent / name).exists() else src / name
            if not target.exists():
                problems.append(f"{f.relative_to(root)}: includes {name}, not found")
                continue
            to = part(target.resolve())
        elif name.startswith("mpiml/"):
            stem = name[len("mpiml/"):].removesuffix(".hpp")
            if stem == "mpiml" or stem in spread:
                continue
            to = public.get(stem)
            if to is None:
                problems.append(f"{f.relative_to(root)}: public header {name} has no part")
                continue
        else:
            continue
        if to == me:
            continue
        edges.setdefault(me, set()).add(to)
        a, b = area(me), area(to)
        if a not in floors or b not in floors:
            problems.append(f"{f.relative_to(root)}: {a if a not in floors else b} has no floor")
        elif a != b and floors[b] >= floors[a]:
            problems.append(f"{f.relative_to(root)}: includes {name}: {a} (floor {floors[a]}) "
                            f"uses {b} (floor {floors[b]})")

for a in sorted(edges):
    for b in sorted(edges[a]):
        if a < b and a in edges.get(b, set()):
            problems.append(f"{a} and {b} include each other")

for p in problems:
    print("layout:", p)
n = sum(len(v) for v in edges.values())
print(f"layout: {len(edges)} parts, {n} include arrows, {len(problems)} problems")
sys.exit(1 if problems else 0)
