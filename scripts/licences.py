#!/usr/bin/env python3
"""Licences and duplicate versions of the Rust dependency graph, offline (`cargo metadata`).

  licences.py check [--metadata FILE] [--policy FILE]
      The lint gate (scripts/test.sh, clippy phase): every crate's licence expression must be
      satisfiable from scripts/dependency-policy.toml's allow-list (or the crate is accepted
      there by name); a crate in more than one version must be on the list of known
      duplicates. Exits 1 naming every crate that fails.

  licences.py notice [--metadata FILE] [--bundled "NAME VERSION SPDX LICENCE-FILE"]...
      The image's NOTICE (Dockerfile, scripts/build-image.sh) on stdout: every crate compiled
      into the `provisioning` binary (normal dependencies of provisioning-cli, proc-macros and
      build scripts' own dependencies excluded) with its version, licence and the licence
      texts its package ships, then each --bundled program (nu) with its licence text.

--metadata reads `cargo metadata --format-version 1` output from a file (tests); otherwise
cargo runs with --offline --locked for this host's platform. Python 3.11 standard library only.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_POLICY = ROOT / "scripts" / "dependency-policy.toml"
BIN_PACKAGE = "provisioning-cli"
# A crate's package files that carry its licence or copyright notice.
LICENCE_FILE = re.compile(r"^(licen[cs]e|copying|notice|copyright|unlicense)([-_.].*)?$", re.IGNORECASE)
# Bounds on what is read from crate packages (a licence text is a few KiB).
MAX_LICENCE_FILE_BYTES = 256 * 1024
MAX_METADATA_BYTES = 64 * 1024 * 1024


class PolicyError(Exception):
    """A licence expression that cannot be read."""


def host_triple() -> str:
    out = subprocess.run(["rustc", "-vV"], check=True, capture_output=True, text=True).stdout
    for line in out.splitlines():
        if line.startswith("host: "):
            return line.removeprefix("host: ").strip()
    raise SystemExit("licences: rustc -vV names no host triple")


def load_metadata(path: str | None) -> dict:
    if path:
        data = Path(path).read_bytes()
    else:
        cargo = os.environ.get("CARGO", "cargo")
        cmd = [cargo, "metadata", "--format-version", "1", "--offline", "--locked",
               "--filter-platform", host_triple(), "--manifest-path", str(ROOT / "Cargo.toml")]
        proc = subprocess.run(cmd, capture_output=True)
        if proc.returncode != 0:
            raise SystemExit(f"licences: {' '.join(cmd)} failed:\n{proc.stderr.decode(errors='replace')}")
        data = proc.stdout
    if len(data) > MAX_METADATA_BYTES:
        raise SystemExit(f"licences: cargo metadata output is over {MAX_METADATA_BYTES} bytes")
    return json.loads(data)


def tokens(expression: str) -> list[str]:
    # Old crates write `MIT/Apache-2.0` for `MIT OR Apache-2.0`.
    spaced = expression.replace("(", " ( ").replace(")", " ) ").replace("/", " OR ")
    return spaced.split()


def satisfiable(expression: str, allow: set[str], exceptions: set[str]) -> bool:
    """Whether the SPDX expression can be met with allowed licences only."""
    toks = tokens(expression)
    pos = 0

    def peek() -> str | None:
        return toks[pos] if pos < len(toks) else None

    def take() -> str:
        nonlocal pos
        if pos >= len(toks):
            raise PolicyError(f"licence expression {expression!r} ends early")
        pos += 1
        return toks[pos - 1]

    def atom() -> bool:
        tok = take()
        if tok == "(":
            value = any_of()
            if take() != ")":
                raise PolicyError(f"licence expression {expression!r}: unbalanced parentheses")
            return value
        if tok in ("AND", "OR", "WITH", ")"):
            raise PolicyError(f"licence expression {expression!r}: {tok} where a licence was expected")
        ok = tok in allow
        if peek() == "WITH":
            take()
            exception = take()  # read even when the licence already failed
            ok = ok and exception in exceptions
        return ok

    def all_of() -> bool:
        value = atom()
        while peek() == "AND":
            take()
            value = atom() and value
        return value

    def any_of() -> bool:
        value = all_of()
        while peek() == "OR":
            take()
            value = all_of() or value
        return value

    if not toks:
        raise PolicyError("empty licence expression")
    result = any_of()
    if pos != len(toks):
        raise PolicyError(f"licence expression {expression!r}: unexpected {toks[pos]!r}")
    return result


def check(metadata: dict, policy: dict) -> list[str]:
    """Every failure, one line each, naming the crate."""
    allow = set(policy.get("licences", {}).get("allow", []))
    exceptions = set(policy.get("licences", {}).get("exceptions-allowed", []))
    by_name = policy.get("licences", {}).get("crates", {})
    known = set(policy.get("duplicates", {}).get("known", []))
    in_graph = {node["id"] for node in metadata.get("resolve", {}).get("nodes", [])}
    packages = [p for p in metadata["packages"] if not in_graph or p["id"] in in_graph]

    failures = []
    for pkg in sorted(packages, key=lambda p: (p["name"], p["version"])):
        name, version, expression = pkg["name"], pkg["version"], pkg.get("license")
        label = f"{name} {version}"
        if name in by_name:
            if expression != by_name[name]:
                failures.append(f"licence: {label} is {expression!r}, accepted by name only as {by_name[name]!r}")
            continue
        if not expression:
            where = f" (only a license-file: {Path(pkg['license_file']).name})" if pkg.get("license_file") else ""
            failures.append(f"licence: {label} declares no SPDX licence{where}")
            continue
        try:
            if not satisfiable(expression, allow, exceptions):
                failures.append(f"licence: {label} is {expression!r}, not satisfiable from the allow-list")
        except PolicyError as e:
            failures.append(f"licence: {label}: {e}")

    versions: dict[str, set[str]] = {}
    for pkg in packages:
        versions.setdefault(pkg["name"], set()).add(pkg["version"])
    for name, found in sorted(versions.items()):
        if len(found) > 1 and name not in known:
            failures.append(f"duplicate: {name} in {len(found)} versions ({', '.join(sorted(found))}), not in [duplicates] known")
    stale = sorted(n for n in known if len(versions.get(n, ())) < 2)
    if stale:
        print(f"licences: no longer duplicated, remove from [duplicates] known: {', '.join(stale)}", file=sys.stderr)
    return failures


def bundled_packages(metadata: dict) -> list[dict]:
    """The packages compiled into the binary: normal dependencies reachable from BIN_PACKAGE,
    not through proc-macros (they run at compile time only)."""
    by_id = {p["id"]: p for p in metadata["packages"]}
    nodes = {n["id"]: n for n in metadata["resolve"]["nodes"]}
    roots = [i for i in metadata["workspace_members"] if by_id[i]["name"] == BIN_PACKAGE]
    if not roots:
        raise SystemExit(f"licences: no workspace member {BIN_PACKAGE}")

    def proc_macro(pkg: dict) -> bool:
        return any("proc-macro" in t["kind"] for t in pkg["targets"])

    seen, todo = set(roots), list(roots)
    while todo:
        for dep in nodes[todo.pop()]["deps"]:
            if not any(k["kind"] is None for k in dep["dep_kinds"]):
                continue
            if dep["pkg"] in seen or proc_macro(by_id[dep["pkg"]]):
                continue
            seen.add(dep["pkg"])
            todo.append(dep["pkg"])
    return sorted((by_id[i] for i in seen), key=lambda p: (p["name"], p["version"]))


def licence_texts(pkg: dict) -> list[tuple[str, str]]:
    """(file name, text) of the licence files a crate's package ships."""
    crate_dir = Path(pkg["manifest_path"]).parent
    files = sorted(p for p in crate_dir.iterdir() if p.is_file() and LICENCE_FILE.match(p.name))
    if pkg.get("license_file"):
        declared = (crate_dir / pkg["license_file"]).resolve()
        if declared.is_file() and declared not in files:
            files.append(declared)
    texts = []
    for path in files:
        if path.stat().st_size > MAX_LICENCE_FILE_BYTES:
            raise SystemExit(f"licences: {pkg['name']} {pkg['version']}: {path.name} is over {MAX_LICENCE_FILE_BYTES} bytes")
        texts.append((path.name, path.read_text(encoding="utf-8", errors="replace").strip()))
    return texts


def notice(metadata: dict, bundled: list[str]) -> str:
    packages = bundled_packages(metadata)
    members = set(metadata["workspace_members"])
    out = [
        "provisioning: third-party notices",
        "",
        "This image bundles the `provisioning` binary (Apache-2.0), the Rust crates compiled into",
        "it (below, with each crate's licence and the licence files its package ships), the",
        "programs listed under \"Other programs\", and shared libraries from Debian (last section).",
        "",
        "=== Rust crates ===",
        "",
    ]
    # Identical texts (the Apache-2.0 file, say) are printed once, with every crate that ships them.
    texts: dict[str, tuple[str, list[str]]] = {}
    for pkg in packages:
        if pkg["id"] in members:
            continue
        label = f"{pkg['name']} {pkg['version']}"
        found = licence_texts(pkg)
        expression = pkg.get("license") or "see its licence file"
        out.append(f"{label}: {expression}" + ("" if found else " (its package ships no licence file)"))
        for file_name, text in found:
            digest = hashlib.sha256(text.encode()).hexdigest()
            texts.setdefault(digest, (text, []))[1].append(f"{label} ({file_name})")
    out += ["", "=== Other programs ===", ""]
    program_texts = []
    for spec in bundled:
        parts = spec.split(maxsplit=3)
        if len(parts) != 4:
            raise SystemExit(f"licences: --bundled wants \"NAME VERSION SPDX LICENCE-FILE\", got {spec!r}")
        name, version, expression, licence_file = parts
        path = Path(licence_file)
        if not path.is_file() or path.stat().st_size > MAX_LICENCE_FILE_BYTES:
            raise SystemExit(f"licences: --bundled {name}: licence file {licence_file!r} missing or over {MAX_LICENCE_FILE_BYTES} bytes")
        out.append(f"{name} {version}: {expression}")
        program_texts.append((f"{name} {version}", path.read_text(encoding="utf-8", errors="replace").strip()))
    out += ["", "=== Licence texts ===", ""]
    for text, owners in texts.values():
        out += ["-" * 78, "Shipped by: " + ", ".join(owners), "", text, ""]
    for owner, text in program_texts:
        out += ["-" * 78, f"Shipped by: {owner}", "", text, ""]
    return "\n".join(out) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    check_cmd = sub.add_parser("check")
    check_cmd.add_argument("--metadata")
    check_cmd.add_argument("--policy", default=str(DEFAULT_POLICY))
    notice_cmd = sub.add_parser("notice")
    notice_cmd.add_argument("--metadata")
    notice_cmd.add_argument("--bundled", action="append", default=[])
    args = parser.parse_args()

    metadata = load_metadata(args.metadata)
    if args.command == "notice":
        sys.stdout.write(notice(metadata, args.bundled))
        return 0
    with open(args.policy, "rb") as f:
        policy = tomllib.load(f)
    failures = check(metadata, policy)
    for line in failures:
        print(f"licences: {line}", file=sys.stderr)
    if failures:
        print(f"licences: {len(failures)} problem(s); policy: {os.path.relpath(args.policy)}", file=sys.stderr)
        return 1
    count = len({n["id"] for n in metadata["resolve"]["nodes"]})
    print(f"licences: {count} crates checked, licences allowed, no new duplicate versions", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
