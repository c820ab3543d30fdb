#!/usr/bin/env python3
"""Import circles between the modules of each library crate, from the sources alone (needs
nothing but python3 and cargo; `scripts/check-import-cycles.py` adds cargo-modules' view and
is the deeper check). Prints every circle and exits 1 when there is one, 0 when there is none.

Method (syntactic): each module file (found from lib.rs through `mod x;`) is stripped of
comments, string literals and `#[cfg(test)]` modules. Module A uses module B when A's code
names a path into B:
- every `use` declaration, its brace groups expanded (`use super::{act, plan::Step};` gives
  `super::act` and `super::plan::Step`), including paths relative to A (`use visit::End;` in
  a parent naming its child module);
- every `crate::…`, `super::…` and `self::…` path anywhere else (function bodies included).
Each path is resolved (as `check-import-cycles.py` does) to the longest module prefix (through the `pub use` re-exports of the
module it lands in); a path to A itself is no edge. Paths into other crates are ignored. The
circles are the strongly connected components of that graph, each printed with one shortest
circle through it. A path named only through a glob import or a type alias of another
module is not seen (approximation).

Usage: scripts/check-module-cycles.py [PKG...]   (default: every library of the workspace)
"""

import importlib.util
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("check_import_cycles", HERE / "check-import-cycles.py")
cic = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cic)

USE = re.compile(r"\buse\s+([^;]+);")


def expand(tree):
    """The flat paths of a use tree (`a::{b, c::{d as e}}` -> ["a::b", "a::c::d"])."""
    tree = re.sub(r"\s+as\s+[A-Za-z_][A-Za-z0-9_]*", "", tree)
    tree = re.sub(r"\s+", "", tree).lstrip(":")
    if "{" not in tree:
        return [tree]
    i = tree.index("{")
    prefix = tree[:i]
    inner = tree[i + 1 : tree.rindex("}")]
    parts, depth, start = [], 0, 0
    for j, ch in enumerate(inner):
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(inner[start:j])
            start = j + 1
    parts.append(inner[start:])
    out = []
    for part in parts:
        if not part:
            continue
        for sub in expand(part):
            if sub == "self":
                out.append(prefix.rstrip(":"))
            elif sub != "*":
                out.append(prefix + sub)
            else:
                out.append(prefix.rstrip(":"))
    return out


_strip_code = cic.strip_code


def strip_with_uses(text):
    """The stripped code with every `use` declaration's paths appended flat, so that the
    path scan (`source_edges`) sees them: `crate::`/`super::`/`self::` paths as they are, any
    other relative to the module (`self::visit::End`; an outside crate resolves to the module
    itself and so gives no edge)."""
    code = _strip_code(text)
    flat = []
    for m in USE.finditer(code):
        for path in expand(m.group(1)):
            first = path.split("::")[0]
            flat.append(path if first in ("crate", "super", "self") else f"self::{path}")
    return code + "\n" + "\n".join(f"{p};" for p in flat)


def module_graph(crate, lib_rs):
    files = cic.files_of(lib_rs, crate)
    modules = set(files)
    graph = {m: set() for m in modules}
    cic.strip_code = strip_with_uses
    try:
        for a, b in cic.source_edges(crate, files, modules):
            graph[a].add(b)
    finally:
        cic.strip_code = _strip_code
    return graph


def main():
    wanted = set(sys.argv[1:])
    circles = 0
    for package, crate, lib_rs in cic.libraries():
        if wanted and package not in wanted:
            continue
        graph = module_graph(crate, lib_rs)
        comps = cic.components(graph)
        edges = sum(len(v) for v in graph.values())
        print(f"{package}: {len(graph)} modules, {edges} use edges, {len(comps)} import circle(s)")
        for comp in comps:
            print("  circle: " + " -> ".join(cic.one_circle(graph, comp)))
            if len(comp) > 2:
                print("    (modules in this knot: " + ", ".join(comp) + ")")
        circles += len(comps)
    return 1 if circles else 0


if __name__ == "__main__":
    sys.exit(main())
