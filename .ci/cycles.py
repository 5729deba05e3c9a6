#!/usr/bin/env python3
"""Import cycles of a Rust crate's src/ (run from the repository root); exits 1 on any cycle not allowed.

Two passes, both over src/**/*.rs with comments and test modules skipped:
1. Module level (issue 21's script): every `crate::<module>` path (and `use crate::{a, b}` groups)
   at top-level-module granularity. Any strongly connected component of more than one module fails.
2. File level: `crate::`, `super::` and `self::` paths and child-module paths (`mod x;` then `x::`)
   resolved to the file that defines the module; a folder's mod.rs using its own parts is not an
   edge (the parts may use their folder's face). A cycle of files fails unless all of them sit in one
   folder and the cycle is listed in ALLOWED below with why it is one type's own parts.
Prints each cycle found (JSON), then a summary line per pass.
"""
import collections, json, os, re, sys

# File-level cycles that are one type's own parts, all in one folder (paths relative to src/).
ALLOWED = {
    frozenset({"admit/budget.rs", "admit/permit.rs", "admit/queue.rs"}):
        "the budget's parts: a Permit is the budget's grant, the WaitQueue its waiters",
    frozenset({"admit/chain.rs", "admit/pool.rs"}):
        "the chunk pool's parts: a ChunkChain is a chain of the pool's chunks",
}


def source(p):
    src = open(p, encoding="utf-8", errors="replace").read()
    m = re.search(r"#\[cfg\(test\)\]\s*(pub\s+)?mod\s+\w+\s*\{", src)
    return "\n".join(l for l in (src[:m.start()] if m else src).split("\n")
                     if not l.strip().startswith("//"))


files = {}
for dp, _, fs in os.walk("src"):
    for f in fs:
        if f.endswith(".rs") and not f.endswith("tests.rs"):
            p = os.path.join(dp, f)
            files[os.path.relpath(p, "src")] = source(p)


def scc(nodes, edges):
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
    for v in sorted(nodes):
        if v not in idx:
            sc(v)
    return [sorted(c) for c in out if len(c) > 1]


# 1. module level
edges = collections.defaultdict(set)
mods = set()
for rel, src in files.items():
    a = rel.split(os.sep)[0].removesuffix(".rs")
    if a in ("main", "lib"):
        continue
    mods.add(a)
    names = re.findall(r"crate::([a-z_][a-z0-9_]*)", src)
    for g in re.findall(r"use crate::\{([^}]*)\}", src, re.S):
        names += re.findall(r"(?:^|,)\s*([a-z_][a-z0-9_]*)", g)
    for t in names:
        if t != a:
            edges[a].add(t)
mod_cycles = scc(mods | {t for s in edges.values() for t in s}, edges)
print(json.dumps(mod_cycles))
print(f"{len(mods)} top-level modules; {len(mod_cycles)} cycle(s); largest "
      f"{max((len(c) for c in mod_cycles), default=0)} modules")

# 2. file level
def mod_path(rel):
    parts = rel.removesuffix(".rs").split(os.sep)
    if parts[-1] == "mod":
        parts = parts[:-1]
    return parts if parts != ["lib"] else []


by_path = {tuple(mod_path(r)): r for r in files if r != "main.rs"}


def resolve(parts):
    for k in range(len(parts), 0, -1):
        f = by_path.get(tuple(parts[:k]))
        if f:
            return f
    return None


path_re = re.compile(r"\b((?:crate|super|self)(?:::[A-Za-z_][A-Za-z0-9_]*)+|"
                     r"(?:crate|super|self)::\{[^}]*\})")
fedges = collections.defaultdict(set)
for rel, src in files.items():
    if rel == "main.rs":
        continue
    here = mod_path(rel)
    # `mod x;` children (with an own file) and `use` groups one level deep
    kids = set(re.findall(r"^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+([a-z_][a-z0-9_]*)\s*;", src, re.M))
    paths = []
    for m in re.finditer(r"\b(crate|super|self)((?:::(?:super|[A-Za-z_][A-Za-z0-9_]*))*)::\{([^}]*)\}", src, re.S):
        base = m.group(1) + m.group(2)
        for item in re.findall(r"(?:^|,)\s*([A-Za-z_][A-Za-z0-9_:]*)", m.group(3)):
            paths.append(base + "::" + item)
    paths += re.findall(r"\b(?:crate|super|self)(?:::(?:super|[A-Za-z_][A-Za-z0-9_]*))+", src)
    for k in kids:
        if re.search(r"(?<![\w:])" + k + r"::", src):
            paths.append("self::" + k)
    for p in paths:
        segs = p.split("::")
        if segs[0] == "crate":
            parts = segs[1:]
        else:
            cur = list(here)
            i = 0
            while i < len(segs) and segs[i] in ("super", "self"):
                if segs[i] == "super":
                    cur = cur[:-1]
                i += 1
            parts = cur + segs[i:]
        t = resolve(parts)
        # a folder's face (mod.rs) declares, re-exports and uses its own parts: not an edge
        face = rel.endswith("mod.rs") and t and t.startswith(os.path.dirname(rel) + os.sep)
        if t and t != rel and not face:
            fedges[rel].add(t)
file_cycles = scc(set(files) - {"main.rs"}, fedges)
bad = []
for c in file_cycles:
    folders = {os.path.dirname(f) for f in c}
    ok = len(folders) == 1 and frozenset(c) in ALLOWED
    print(json.dumps({"files": c, "allowed": ALLOWED.get(frozenset(c)) if ok else None}))
    if not ok:
        bad.append(c)
print(f"{len(files)} files; {len(file_cycles)} file-level cycle(s), {len(bad)} not allowed")
if mod_cycles or bad:
    print("import cycles: break them (a stage takes the small input it needs; see issue 21), "
          "or list a one-folder cycle of one type's parts in ALLOWED in .ci/cycles.py", file=sys.stderr)
    sys.exit(1)
