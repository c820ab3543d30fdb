#!/usr/bin/env python3
"""How many places a reader visits following one reconcile through the controller's code.

Usage: scripts/reconcile-walk.py [--depth N] [--own] [--tree] ENTRY...
  ENTRY is a product function of the controller crate as `module::function` (a free function,
  e.g. `server::apply`, `taskserv::apply`, `cluster::apply`) or `module::Type::method`.
  Default: the three `apply` entries. `--depth 1` counts the entry and what it calls directly
  (shallow); the default follows calls transitively (deep). `--own` follows only the entry's
  kind (its top module, e.g. `server::…`) and the shared skeleton (`reconcile`, `approval`):
  calls into the services every kind uses (context, conditions, history, events...) are
  neither places nor followed. `--tree` prints the walk.

Method (a syntactic approximation, no type checking):
- The crate is `controller/src`. Each file is stripped of comments, string and char literals
  and `#[cfg(test)]` modules (tests are not product code). Functions are the `fn` items with
  a body, named by module path, plus the impl or trait type they sit in (`visit::Visit::conclude`).
- In a function's body (closures included), calls are found in source order:
  * path calls `a::b::f(..)` / `f(..)` / `Type::f(..)` / `Self::f(..)`, resolved through the
    file's `use` declarations, `crate::` / `super::` / `self::` and child modules, then to a
    free function of that module or to a method of that type (by the type's last name);
  * method calls `.f(..)`: `self.f(..)` resolves to the enclosing impl type's method when it
    has one; a receiver named by the crate's conventions (`ctx` is a `Context`, `visit` a
    `Visit`, `api` kube's: see RECEIVERS) to that type's method; a name std, futures or kube
    also use (LIBRARY_METHODS: `clone`, `get`, `patch_status`...) on any other receiver is the
    library's; otherwise every method of that name in the crate when there are at most two
    (more is a name too common to guess, and is skipped).
  Calls that resolve to nothing in the crate (std, kube, other crates, macros, constructors
  such as `Some(..)` or `End::Done(..)`) are not places.
- The walk is depth first, in call order, from the entry; each function is one place, visited
  once (a second call of a known place is not a new place).
- Printed: places (functions visited), files (distinct files among them) and returns (steps of
  the walk, in visiting order, onto a file the reader had already left: A -> B -> A counts 1).
"""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "controller" / "src"
KEYWORDS = {
    "if", "while", "for", "match", "loop", "return", "fn", "let", "in", "as", "move", "async", "await", "unsafe", "impl", "where",
    "mut", "ref", "pub", "use", "mod", "struct", "enum", "trait", "type", "const", "static", "else", "break", "continue", "dyn",
    "Some", "None", "Ok", "Err", "Box", "Vec", "String", "Arc", "format", "matches", "vec",
}
CFG_TEST = re.compile(r"#\[cfg\(test\)\]\s*(?:#\[[^\]]*\]\s*)*(?:pub(?:\([^)]*\))?\s+)?mod\s+\w+\s*\{")
FN = re.compile(r"\bfn\s+([A-Za-z_][A-Za-z0-9_]*)")
IMPL = re.compile(r"\b(impl|trait)\b")
USE = re.compile(r"\buse\s+([^;]+);")
PATH_CALL = re.compile(r"(?<![.\w:])((?:[A-Za-z_][A-Za-z0-9_]*\s*::\s*)*[A-Za-z_][A-Za-z0-9_]*)\s*(?:::\s*<[^()]*?>\s*)?\(")
METHOD_CALL = re.compile(r"(?:\b([A-Za-z_][A-Za-z0-9_]*)\s*(?:\(\s*\)|\?)?\s*)?\.\s*([A-Za-z_][A-Za-z0-9_]*)\s*(?:::\s*<[^()]*?>\s*)?\(")
# The controller's receiver names and their types (`None`: a type from another crate, e.g.
# kube's `Api`, whose methods are never places).
RECEIVERS = {
    "ctx": "Context", "core": "Context", "tctx": "TaskServContext", "cctx": "ClusterContext", "visit": "Visit", "ws": "EffectiveWorkspace",
    "workspace": "EffectiveWorkspace", "history": "ChangeHistory", "audit": "AuditLog", "metrics": "Metrics", "recorder": "Publisher",
    "p": "Prepared", "prepared": "Prepared", "api": None, "client": None, "provider": None, "servers": None, "stores": None,
    "store": None, "stream": None, "semaphore": None, "tx": None, "rx": None, "map": None, "seen": None,
}
# Method names of std, futures and kube that the crate's own types reuse: a call on another
# receiver is taken to be the library's.
LIBRARY_METHODS = {
    "clone", "list", "key", "finish", "entry", "push", "lock", "get", "get_opt", "insert", "remove", "len", "is_empty", "iter",
    "into_iter", "map", "and_then", "send", "next", "as_str", "as_ref", "to_string", "contains", "contains_key", "extend", "take",
    "state", "record", "start", "run", "new", "default", "fmt", "from", "into", "patch", "patch_status", "create", "delete",
    "replace", "apply", "status", "find", "filter", "join", "split", "write", "read", "parse", "now", "wait", "watch", "spawn",
    "abort", "close", "flush", "set", "update", "merge", "sum", "count", "max", "min", "cmp", "eq", "hash", "drain", "retain",
    "load", "store", "swap", "reset", "name", "kind", "value", "values", "keys", "first", "last", "pop", "sort", "dedup",
}


def strip(text):
    """Code without comments, literals (kept as blanks, lines kept) and test modules."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif c == "r" and (m := re.match(r'r(#*)"', text[i:])) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            end = text.find('"' + m.group(1), i + len(m.group(0)))
            j = n if end < 0 else end + 1 + len(m.group(1))
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j + 1
        elif c == "'" and (m := re.match(r"'(\\u\{[0-9a-fA-F]+\}|\\.|[^\\'])'", text[i:])):
            out.append("' '")
            i += len(m.group(0))
        else:
            out.append(c)
            i += 1
    code = "".join(out)
    while m := CFG_TEST.search(code):
        end = match_brace(code, m.end() - 1)
        code = code[: m.start()] + "\n" * code.count("\n", m.start(), end) + code[end:]
    return code


def match_brace(code, open_at):
    """Index just past the brace closing the one at `open_at`."""
    depth, j = 0, open_at
    while j < len(code):
        if code[j] == "{":
            depth += 1
        elif code[j] == "}":
            depth -= 1
            if depth == 0:
                return j + 1
        j += 1
    return len(code)


def module_of(file):
    rel = file.relative_to(SRC).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] in ("mod", "lib"):
        parts = parts[:-1]
    return "::".join(parts)


def expand(tree):
    """Flat (path, alias) pairs of a use tree."""
    tree = re.sub(r"\s+", " ", tree).strip()
    if "{" not in tree:
        m = re.match(r"(.*?)(?: as ([A-Za-z_]\w*))?$", tree)
        path = m.group(1).replace(" ", "")
        alias = m.group(2) or path.split("::")[-1]
        return [(path, alias)]
    i = tree.index("{")
    prefix = tree[:i].replace(" ", "")
    inner = tree[i + 1 : tree.rindex("}")]
    parts, depth, start = [], 0, 0
    for j, ch in enumerate(inner):
        depth += {"{": 1, "}": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append(inner[start:j])
            start = j + 1
    parts.append(inner[start:])
    out = []
    for part in filter(str.strip, parts):
        for path, alias in expand(part):
            if path == "self":
                out.append((prefix.rstrip(":"), prefix.rstrip(":").split("::")[-1] if alias == "self" else alias))
            elif path != "*":
                out.append((prefix + path, alias))
    return out


class Crate:
    def __init__(self):
        self.functions = {}  # key -> dict(name, module, type, file, line, body)
        self.by_module = {}  # (module, name) -> key
        self.by_type = {}  # (type, name) -> [key]
        self.by_name = {}  # method name -> [key]
        self.uses = {}  # module -> alias -> absolute path
        self.modules = set()
        self.types = {}  # type name -> modules defining it
        for file in sorted(SRC.rglob("*.rs")):
            self.read(file)

    def read(self, file):
        module = module_of(file)
        self.modules.add(module)
        code = strip(file.read_text())
        aliases = self.uses.setdefault(module, {})
        for m in USE.finditer(code):
            for path, alias in expand(m.group(1)):
                aliases[alias] = self.absolute(module, path)
        for m in re.finditer(r"\b(?:struct|enum|trait|type)\s+([A-Z]\w*)", code):
            self.types.setdefault(m.group(1), set()).add(module)
        # impl / trait blocks: span -> type name
        blocks = []
        for m in IMPL.finditer(code):
            header_end = code.find("{", m.end())
            semi = code.find(";", m.end())
            if header_end < 0 or (0 <= semi < header_end):
                continue
            header = re.sub(r"<[^<>]*(?:<[^<>]*>[^<>]*)*>", "", code[m.end() : header_end])
            header = header.split(" where ")[0]
            if m.group(1) == "trait":
                name = re.match(r"\s*([A-Za-z_]\w*)", header)
            else:
                target = header.split(" for ")[-1]
                name = re.search(r"([A-Za-z_]\w*)\s*$", target.strip())
            if name:
                blocks.append((header_end, match_brace(code, header_end), name.group(1)))
        for m in FN.finditer(code):
            j, depth = m.end(), 0
            while j < len(code):
                ch = code[j]
                if ch in "([":
                    depth += 1
                elif ch in ")]":
                    depth -= 1
                elif depth == 0 and ch in "{;":
                    break
                j += 1
            if j >= len(code) or code[j] == ";":
                continue  # a declaration without a body
            end = match_brace(code, j)
            owner = [b for b in blocks if b[0] < m.start() < b[1]]
            type_ = owner[-1][2] if owner else None
            name = m.group(1)
            key = f"{module}::{type_}::{name}" if type_ else f"{module}::{name}"
            if key in self.functions:
                key = f"{key}@{code.count(chr(10), 0, m.start()) + 1}"
            self.functions[key] = {
                "name": name,
                "module": module,
                "type": type_,
                "file": str(file.relative_to(ROOT)),
                "line": code.count("\n", 0, m.start()) + 1,
                "body": code[j:end],
            }
            if type_:
                self.by_type.setdefault((type_, name), []).append(key)
                self.by_name.setdefault(name, []).append(key)
            else:
                self.by_module.setdefault((module, name), key)

    def absolute(self, module, path):
        segments = path.split("::")
        current = module.split("::") if module else []
        if segments[0] == "crate":
            return "::".join(segments[1:])
        if segments[0] in ("super", "self"):
            while segments and segments[0] in ("super", "self"):
                if segments.pop(0) == "super":
                    current = current[:-1]
            return "::".join(current + segments)
        if "::".join(current + [segments[0]]) in self.modules or (module and f"{module}::{segments[0]}" in self.known_children(module)):
            return "::".join(current + segments)
        return "extern::" + path

    def known_children(self, module):
        base = SRC.joinpath(*module.split("::")) if module else SRC
        return {f"{module}::{p.stem}" for p in base.glob("*.rs")} | {f"{module}::{p.name}" for p in base.iterdir() if p.is_dir()} if base.is_dir() else set()

    def resolve_path(self, fn, text):
        segments = [s.strip() for s in text.split("::")]
        name, prefix = segments[-1], segments[:-1]
        module = fn["module"]
        if name in KEYWORDS:
            return []
        if not prefix:
            if (module, name) in self.by_module:
                return [self.by_module[(module, name)]]
            full = self.uses.get(module, {}).get(name)
            return self.lookup(full) if full else []
        first = prefix[0]
        if first == "Self" and fn["type"]:
            return self.by_type.get((fn["type"], name), [])
        if first in ("crate", "super", "self"):
            base = self.absolute(module, "::".join(prefix))
        elif first in self.uses.get(module, {}):
            base = "::".join([self.uses[module][first]] + prefix[1:])
        elif f"{module}::{first}".strip(":") in self.modules:
            base = "::".join(([module] if module else []) + prefix)
        elif first in self.modules:
            base = "::".join(prefix)
        elif first[:1].isupper() and first in self.types:
            base = first
        else:
            return []
        return self.lookup(f"{base}::{name}")

    def lookup(self, full):
        if full.startswith("extern::"):
            return []
        segments = full.split("::")
        name, owner = segments[-1], "::".join(segments[:-1])
        if (owner, name) in self.by_module:
            return [self.by_module[(owner, name)]]
        if owner in self.modules:
            # A `pub use` re-export in that module.
            again = self.uses.get(owner, {}).get(name)
            return self.lookup(again) if again and again != full else []
        type_ = segments[-2] if len(segments) >= 2 else None
        if type_ and type_[:1].isupper():
            return self.by_type.get((type_, name), [])
        return []

    def calls(self, key):
        fn = self.functions[key]
        body = fn["body"]
        found = []
        for m in PATH_CALL.finditer(body):
            before = body[: m.start()].rstrip()
            if before.endswith("fn") or before.endswith("!"):
                continue
            for target in self.resolve_path(fn, m.group(1)):
                found.append((m.start(), target))
        for m in METHOD_CALL.finditer(body):
            receiver, name = m.group(1), m.group(2)
            if receiver == "self" and fn["type"] and (fn["type"], name) in self.by_type:
                targets = self.by_type[(fn["type"], name)]
            elif receiver in RECEIVERS:
                targets = self.by_type.get((RECEIVERS[receiver], name), []) if RECEIVERS[receiver] else []
                if not targets and RECEIVERS[receiver] in ("TaskServContext", "ClusterContext"):
                    targets = self.by_type.get(("Context", name), [])
            elif name in LIBRARY_METHODS:
                targets = []
            else:
                candidates = self.by_name.get(name, [])
                targets = candidates if len(candidates) <= 2 else []
            for target in targets:
                found.append((m.start(), target))
        found.sort()
        out = []
        for _, target in found:
            if target != key and target not in out:
                out.append(target)
        return out


def entry_key(crate, entry):
    if entry in crate.functions:
        return entry
    segments = entry.split("::")
    found = crate.lookup(entry)
    if found:
        return found[0]
    raise SystemExit(f"reconcile-walk: no product function {entry!r} in controller/src (try module::function or module::Type::method)")


# With --own: the modules every kind's reconcile shares (the skeleton and the approval gate)
# are followed like the kind's own; all other modules are services a reader takes as given.
SKELETON = ("reconcile", "approval")


def own(module, kind):
    return any(module == m or module.startswith(m + "::") for m in (kind, *SKELETON))


def walk(crate, entry, depth_limit, kind=None):
    order, seen = [], set()

    def visit(key, depth):
        seen.add(key)
        order.append((key, depth))
        if depth_limit is not None and depth >= depth_limit:
            return
        for callee in crate.calls(key):
            if callee not in seen and (kind is None or own(crate.functions[callee]["module"], kind)):
                visit(callee, depth + 1)

    sys.setrecursionlimit(10_000)
    visit(entry, 0)
    return order


def measure(crate, order):
    files = [crate.functions[k]["file"] for k, _ in order]
    left, returns = set(), 0
    for previous, current in zip(files, files[1:]):
        if current != previous:
            left.add(previous)
            if current in left:
                returns += 1
    return len(order), len(set(files)), returns


def main(argv):
    depth, tree, only_own, entries = None, False, False, []
    args = iter(argv)
    for a in args:
        if a == "--depth":
            depth = int(next(args))
        elif a == "--tree":
            tree = True
        elif a == "--own":
            only_own = True
        elif a in ("-h", "--help"):
            print(__doc__)
            return 0
        else:
            entries.append(a)
    entries = entries or ["server::apply", "taskserv::apply", "cluster::apply"]
    crate = Crate()
    for entry in entries:
        key = entry_key(crate, entry)
        kind = crate.functions[key]["module"].split("::")[0] if only_own else None
        order = walk(crate, key, depth, kind)
        places, files, returns = measure(crate, order)
        mode = ("deep" if depth is None else f"depth {depth}") + (f", own: {kind}/ + {', '.join(SKELETON)}" if kind else "")
        print(f"{entry} ({mode}): {places} places in {files} files, {returns} returns to a file already left")
        if tree:
            for k, d in order:
                f = crate.functions[k]
                print(f"  {'  ' * d}{k.split('@')[0]}  ({f['file']}:{f['line']})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
