#!/usr/bin/env python3
"""Module-level import cycles of a Rust crate's src/ (run from the repository root).

Edges: every `crate::<module>` path (and `use crate::{a, b}` groups) in src/**/*.rs, comments and
test modules skipped, at top-level-module granularity. Prints the strongly connected components
with more than one module as JSON, then a summary line.
"""
import collections, json, os, re, sys

edges = collections.defaultdict(set)
mods = set()
for dp, _, fs in os.walk("src"):
    for f in fs:
        if not f.endswith(".rs") or f.endswith("tests.rs"):
            continue
        p = os.path.join(dp, f)
        src = open(p, encoding="utf-8", errors="replace").read()
        m = re.search(r"#\[cfg\(test\)\]\s*(pub\s+)?mod\s+\w+\s*\{", src)
        src = "\n".join(l for l in (src[:m.start()] if m else src).split("\n")
                        if not l.strip().startswith("//"))
        a = os.path.relpath(p, "src").split(os.sep)[0].removesuffix(".rs")
        if a in ("main", "lib"):
            continue
        mods.add(a)
        names = re.findall(r"crate::([a-z_][a-z0-9_]*)", src)
        for g in re.findall(r"use crate::\{([^}]*)\}", src, re.S):
            names += re.findall(r"(?:^|,)\s*([a-z_][a-z0-9_]*)", g)
        for t in names:
            if t != a:
                edges[a].add(t)
sys.setrecursionlimit(10000)
idx, low, st, on, out, n = {}, {}, [], set(), [], [0]
def sc(v):
    idx[v] = low[v] = n[0]; n[0] += 1; st.append(v); on.add(v)
    for w in edges.get(v, ()):
        if w not in idx:
            sc(w); low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], idx[w])
    if low[v] == idx[v]:
        c = []
        while True:
            w = st.pop(); on.discard(w); c.append(w)
            if w == v:
                break
        out.append(c)
for v in sorted(mods | {t for s in edges.values() for t in s}):
    if v not in idx:
        sc(v)
cycles = [sorted(c) for c in out if len(c) > 1]
print(json.dumps(cycles))
print(f"{len(mods)} top-level modules; {len(cycles)} cycle(s); largest {max((len(c) for c in cycles), default=0)} modules")
