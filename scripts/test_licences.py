#!/usr/bin/env python3
"""Tests of scripts/licences.py on crafted `cargo metadata` (run by scripts/test.sh before the
check itself: `python3 scripts/test_licences.py`)."""

import contextlib
import io
import json
import subprocess
import sys
import tempfile
import tomllib
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import licences  # noqa: E402

SCRIPT = Path(__file__).resolve().parent / "licences.py"
POLICY = tomllib.loads("""
[licences]
allow = ["MIT", "Apache-2.0", "BSD-3-Clause", "Unicode-3.0"]
exceptions-allowed = ["LLVM-exception"]
[licences.crates]
webdriver = "MPL-2.0"
[duplicates]
known = ["syn"]
""")


def package(name, version, licence, deps=(), kind="lib"):
    ident = f"registry+https://github.com/rust-lang/crates.io-index#{name}@{version}"
    return {
        "id": ident, "name": name, "version": version, "license": licence, "license_file": None,
        "manifest_path": f"/nonexistent/{name}-{version}/Cargo.toml",
        "targets": [{"kind": [kind], "name": name}], "_deps": list(deps),
    }


def metadata(*packages):
    nodes = [{"id": p["id"], "deps": [{"pkg": d["id"], "name": d["name"], "dep_kinds": [{"kind": None, "target": None}]}
                                      for d in p.pop("_deps")]} for p in packages]
    return {"packages": list(packages), "workspace_members": [packages[0]["id"]], "resolve": {"nodes": nodes}}


class Expressions(unittest.TestCase):
    def ok(self, expression):
        return licences.satisfiable(expression, set(POLICY["licences"]["allow"]), {"LLVM-exception"})

    def test_or_needs_one_side_and_needs_both(self):
        self.assertTrue(self.ok("MIT OR Apache-2.0"))
        self.assertTrue(self.ok("GPL-3.0-only OR MIT"))
        self.assertFalse(self.ok("GPL-3.0-only AND MIT"))
        self.assertFalse(self.ok("LGPL-2.1-or-later"))
        self.assertTrue(self.ok("(MIT OR Apache-2.0) AND Unicode-3.0"))
        self.assertFalse(self.ok("(MIT OR Apache-2.0) AND AGPL-3.0-only"))

    def test_slash_is_or_and_with_needs_a_known_exception(self):
        self.assertTrue(self.ok("MIT/Apache-2.0"))
        self.assertTrue(self.ok("Apache-2.0 WITH LLVM-exception"))
        self.assertFalse(self.ok("Apache-2.0 WITH Some-other-exception"))
        self.assertFalse(self.ok("GPL-2.0-only WITH LLVM-exception"))

    def test_malformed_expressions_are_errors_not_passes(self):
        for bad in ("", "(MIT OR Apache-2.0", "MIT OR", "MIT Apache-2.0", "AND MIT"):
            with self.assertRaises(licences.PolicyError, msg=bad):
                self.ok(bad)


class Check(unittest.TestCase):
    def test_a_clean_graph_passes(self):
        leaf = package("itoa", "1.0.0", "MIT OR Apache-2.0")
        root = package("provisioning-cli", "0.1.0", "Apache-2.0", [leaf])
        self.assertEqual(licences.check(metadata(root, leaf), POLICY), [])

    def test_copyleft_and_unknown_and_missing_licences_fail_naming_the_crate(self):
        gpl = package("gpl-thing", "2.0.0", "GPL-3.0-only")
        odd = package("odd-thing", "0.3.1", "LicenseRef-Proprietary")
        none = package("no-licence", "0.1.0", None)
        root = package("provisioning-cli", "0.1.0", "Apache-2.0", [gpl, odd, none])
        failures = licences.check(metadata(root, gpl, odd, none), POLICY)
        self.assertEqual(len(failures), 3, failures)
        self.assertTrue(any("gpl-thing 2.0.0" in f and "GPL-3.0-only" in f for f in failures), failures)
        self.assertTrue(any("odd-thing 0.3.1" in f for f in failures), failures)
        self.assertTrue(any("no-licence 0.1.0" in f and "no SPDX" in f for f in failures), failures)

    def test_a_crate_accepted_by_name_only_under_its_recorded_licence(self):
        ok = package("webdriver", "0.53.0", "MPL-2.0")
        root = package("provisioning-cli", "0.1.0", "Apache-2.0", [ok])
        self.assertEqual(licences.check(metadata(root, ok), POLICY), [])
        changed = package("webdriver", "0.54.0", "GPL-3.0-only")
        root = package("provisioning-cli", "0.1.0", "Apache-2.0", [changed])
        failures = licences.check(metadata(root, changed), POLICY)
        self.assertEqual(len(failures), 1, failures)
        self.assertIn("webdriver 0.54.0", failures[0])

    def test_a_new_duplicate_fails_with_its_name_a_known_one_does_not(self):
        syn1, syn2 = package("syn", "1.0.0", "MIT"), package("syn", "2.0.0", "MIT")
        rand1, rand2 = package("rand", "0.8.5", "MIT"), package("rand", "0.9.0", "MIT")
        root = package("provisioning-cli", "0.1.0", "Apache-2.0", [syn1, syn2, rand1, rand2])
        with contextlib.redirect_stderr(io.StringIO()):
            failures = licences.check(metadata(root, syn1, syn2, rand1, rand2), POLICY)
        self.assertEqual(len(failures), 1, failures)
        self.assertIn("duplicate: rand in 2 versions (0.8.5, 0.9.0)", failures[0])


class CommandLine(unittest.TestCase):
    def test_check_exits_1_naming_the_crate(self):
        gpl = package("gpl-thing", "2.0.0", "GPL-3.0-only")
        root = package("provisioning-cli", "0.1.0", "Apache-2.0", [gpl])
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "metadata.json"
            path.write_text(json.dumps(metadata(root, gpl)))
            proc = subprocess.run([sys.executable, str(SCRIPT), "check", "--metadata", str(path)],
                                  capture_output=True, text=True, check=False)
        self.assertEqual(proc.returncode, 1, proc.stderr)
        self.assertIn("gpl-thing 2.0.0", proc.stderr)


class Notice(unittest.TestCase):
    def test_notice_lists_the_binarys_crates_not_proc_macros_nor_dev_only_ones(self):
        with tempfile.TemporaryDirectory() as d:
            crate_dir = Path(d) / "itoa-1.0.0"
            crate_dir.mkdir()
            (crate_dir / "LICENSE-MIT").write_text("MIT text of itoa")
            leaf = package("itoa", "1.0.0", "MIT OR Apache-2.0")
            leaf["manifest_path"] = str(crate_dir / "Cargo.toml")
            inner = package("macro-helper", "1.0.0", "MIT")
            derive = package("serde_derive", "1.0.0", "MIT", [inner], kind="proc-macro")
            dev = package("dev-only", "1.0.0", "MIT")
            root = package("provisioning-cli", "0.1.0", "Apache-2.0", [leaf, derive, dev])
            meta = metadata(root, leaf, derive, inner, dev)
            meta["resolve"]["nodes"][0]["deps"][2]["dep_kinds"] = [{"kind": "dev", "target": None}]
            nu_licence = Path(d) / "LICENSE"
            nu_licence.write_text("MIT text of nushell")
            text = licences.notice(meta, [f"nushell 0.115.1 MIT {nu_licence}"])
        self.assertIn("itoa 1.0.0: MIT OR Apache-2.0", text)
        self.assertIn("MIT text of itoa", text)
        self.assertIn("nushell 0.115.1: MIT", text)
        self.assertIn("MIT text of nushell", text)
        for absent in ("serde_derive", "macro-helper", "dev-only", "provisioning-cli 0.1.0:"):
            self.assertNotIn(absent, text)


if __name__ == "__main__":
    unittest.main()
