#!/usr/bin/env python3
"""Import circles between the modules of each library crate: prints every circle and exits 1
when there is one, 0 when there is none.

Module A uses module B when anything in A names anything in B. Two sources of those edges:
- cargo-modules (`cargo install cargo-modules`; 0.27 works with Rust 1.95):
  `cargo modules dependencies --lib -p PKG --no-externs --no-sysroot` lists every module and
  item and the "uses" edges of `use` declarations; each edge is lifted to the modules holding
  its two ends (an item belongs to the innermost module whose path prefixes its own);
- the sources themselves, because cargo-modules 0.27 does not see paths named inside function
  bodies (`crate::history::recorded(..)` in a method gives no edge): every `crate::…`,
  `super::…` and `self::…` path outside comments and `#[cfg(test)]` modules, resolved to the
  longest module prefix (through the `pub use` re-exports of the module it lands in).
The circles are the strongly connected components of that module graph, each printed with one
shortest circle through it. (cargo-modules' own `--acyclic` checks the graph of items, where a
struct and its derived `default` already count as a circle, so it cannot be used for this.)

Usage: scripts/check-import-cycles.py [PKG...]   (default: every library of the workspace)
"""

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NODE = re.compile(r'^\s*"([^"]+)" \[label="([^|"]*)\|')
EDGE = re.compile(r'^\s*"([^"]+)" -> "([^"]+)" \[label="uses"')
PATH = re.compile(r"\b((?:crate|super|self)(?:::(?:super|[A-Za-z_][A-Za-z0-9_]*))+)")
GLOB = re.compile(r"\bpub use ([A-Za-z_][A-Za-z0-9_:]*)::\*;")
REEXPORT = re.compile(r"\bpub use ([A-Za-z_][A-Za-z0-9_:]*?)(?:::\{([^}]*)\}|::([A-Za-z_][A-Za-z0-9_]*)(?: as ([A-Za-z_][A-Za-z0-9_]*))?);")
CFG_TEST_MOD = re.compile(r"#\[cfg\(test\)\]\s*(?:#\[[^\]]*\]\s*)*(?:pub(?:\([^)]*\))?\s+)?mod\s+\w+\s*\{")


def libraries():
    """(package name, crate name, lib.rs path) of every library in the workspace."""
    meta = json.loads(
        subprocess.run(["cargo", "metadata", "--no-deps", "--format-version", "1"], cwd=ROOT, check=True, capture_output=True, text=True).stdout
    )
    out = []
    for package in meta["packages"]:
        for target in package["targets"]:
            if "lib" in target["kind"]:
                out.append((package["name"], target["name"].replace("-", "_"), Path(target["src_path"])))
    return out


def cargo_modules(package):
    """(modules, use edges) from cargo-modules."""
    out = subprocess.run(
        ["cargo", "modules", "dependencies", "--lib", "-p", package, "--no-externs", "--no-sysroot"], cwd=ROOT, capture_output=True, text=True
    )
    if out.returncode != 0:
        raise SystemExit(f"cargo modules failed for {package}:\n{out.stderr}")
    modules, uses = set(), []
    for line in out.stdout.splitlines():
        if m := EDGE.match(line):
            uses.append((m.group(1), m.group(2)))
        elif (m := NODE.match(line)) and m.group(2).split()[-1] in ("mod", "crate"):
            modules.add(m.group(1))
    return modules, uses


def strip_code(text):
    """The code of a Rust file without comments, string literals and `#[cfg(test)]` modules."""
    out, i, n = [], 0, len(text)
    while i < n:
        if text.startswith("//", i):
            i = text.find("\n", i)
            i = n if i < 0 else i
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            i = n if j < 0 else j + 2
        elif text[i] == '"' or (text[i] == "r" and re.match(r'r#*"', text[i:]) and (i == 0 or not text[i - 1].isalnum())):
            m = re.match(r'r(#*)"', text[i:])
            if m:
                end = text.find('"' + m.group(1), i + len(m.group(0)))
                i = n if end < 0 else end + 1 + len(m.group(1))
            else:
                j = i + 1
                while j < n and text[j] != '"':
                    j += 2 if text[j] == "\\" else 1
                i = j + 1
            out.append('""')
        elif text[i] == "'" and re.match(r"'(\\.|[^\\'])'", text[i:]):
            i += len(re.match(r"'(\\.|[^\\'])'", text[i:]).group(0))
        else:
            out.append(text[i])
            i += 1
    code = "".join(out)
    while m := CFG_TEST_MOD.search(code):
        depth, j = 1, m.end()
        while j < len(code) and depth:
            depth += {"{": 1, "}": -1}.get(code[j], 0)
            j += 1
        code = code[: m.start()] + code[j:]
    return code


def files_of(lib_rs, crate):
    """module path -> source file, following `mod x;` from the crate root."""
    found = {}

    def walk(path, file):
        found[path] = file
        for m in re.finditer(r"^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;", strip_code(file.read_text()), re.M):
            name = m.group(1)
            base = file.parent if file.name in ("lib.rs", "mod.rs", "main.rs") else file.parent / file.stem
            for candidate in (base / f"{name}.rs", base / name / "mod.rs"):
                if candidate.exists():
                    walk(f"{path}::{name}", candidate)
                    break

    walk(crate, lib_rs)
    return found


def source_edges(crate, files, modules):
    """(from module, to module) for every crate/super/self path in the code."""
    codes = {path: strip_code(file.read_text()) for path, file in files.items()}
    reexports, globs = {}, {}
    for path, code in codes.items():
        for m in GLOB.finditer(code):
            globs.setdefault(path, []).append(resolve_module(absolute(path, m.group(1), crate), modules))
        for m in REEXPORT.finditer(code):
            base, group, single, alias = m.groups()
            names = [(single, alias or single)] if single else [(n.split(" as ")[0].strip(), n.split(" as ")[-1].strip()) for n in group.split(",") if n.strip()]
            for _, exported in names:
                reexports[(path, exported)] = absolute(path, base, crate)

    def resolve(path_in, text):
        segments = absolute(path_in, text, crate).split("::")
        for k in range(len(segments), 0, -1):
            prefix = "::".join(segments[:k])
            if prefix in modules:
                rest = segments[k:]
                target = reexports.get((prefix, rest[0])) if rest else None
                if target:
                    return resolve_module(target, modules)
                for glob in globs.get(prefix, []) if rest else []:
                    if re.search(rf"\bpub\s+(?:struct|enum|fn|type|const|static|trait|mod)\s+{rest[0]}\b", codes.get(glob, "")):
                        return glob
                return prefix
        return None

    edges = []
    for path, code in codes.items():
        for m in PATH.finditer(code):
            target = resolve(path, m.group(1))
            if target and target != path:
                edges.append((path, target))
    return edges


def absolute(module, text, crate):
    """`text` (crate::…, super::…, self::… or a path relative to `module`) as an absolute path."""
    segments = text.split("::")
    if segments[0] == "crate":
        return "::".join([crate] + segments[1:])
    current = module.split("::")
    while segments and segments[0] in ("super", "self"):
        if segments.pop(0) == "super":
            current = current[:-1]
    return "::".join(current + segments)


def resolve_module(path, modules):
    segments = path.split("::")
    for k in range(len(segments), 0, -1):
        if "::".join(segments[:k]) in modules:
            return "::".join(segments[:k])
    return path


def module_graph(package, crate, lib_rs):
    modules, uses = cargo_modules(package)
    files = files_of(lib_rs, crate)
    modules |= set(files)

    def module_of(path):
        while path not in modules and "::" in path:
            path = path.rsplit("::", 1)[0]
        return path

    graph = {m: set() for m in modules}
    for src, dst in uses:
        a, b = module_of(src), module_of(dst)
        if a != b:
            graph.setdefault(a, set()).add(b)
            graph.setdefault(b, set())
    for a, b in source_edges(crate, files, modules):
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    return graph


def components(graph):
    """Tarjan's strongly connected components with more than one module."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    sys.setrecursionlimit(10_000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def one_circle(graph, comp):
    """A shortest circle through the first module of a component (breadth-first)."""
    members, start = set(comp), comp[0]
    paths, seen = [[start]], {start}
    while paths:
        path = paths.pop(0)
        for w in sorted(graph[path[-1]] & members):
            if w == start:
                return path + [start]
            if w not in seen:
                seen.add(w)
                paths.append(path + [w])
    return comp


def main():
    wanted = set(sys.argv[1:])
    circles = 0
    for package, crate, lib_rs in libraries():
        if wanted and package not in wanted:
            continue
        graph = module_graph(package, crate, lib_rs)
        comps = components(graph)
        edges = sum(len(v) for v in graph.values())
        print(f"{package}: {len(graph)} modules, {edges} use edges, {len(comps)} import circle(s)")
        for comp in comps:
            print("  circle: " + " -> ".join(one_circle(graph, comp)))
            if len(comp) > 2:
                print("    (modules in this knot: " + ", ".join(comp) + ")")
        circles += len(comps)
    return 1 if circles else 0


if __name__ == "__main__":
    sys.exit(main())
