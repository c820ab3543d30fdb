#!/usr/bin/env python3
"""Runs the workspace's test binaries in parallel lanes (what `scripts/test.sh` calls).

`cargo test` runs one test binary after another; most of the suite's time is spent in
end-to-end binaries that wait on Docker, `nu` and the embedded control plane, not on the
CPU. This runner asks cargo for the test binaries it already built (`cargo test --no-run`),
then runs them LANES at a time, longest first (durations from scripts/test-durations.txt,
measured on the project's machine; an unknown binary counts as short; end-to-end binaries that
create Docker machines under the same namespace/cluster names never run at once), each in its
package's directory with the environment cargo would give it. Each binary's output is
printed whole when it finishes (as cargo prints it), then a summary of every binary's time
and result, and the closing line `N passed, N failed`.

Usage: scripts/run-tests.py [--lanes N] [--only PKG/BINARY ...] [--package PKG ...] [--repeat N] [-- TEST ARGS]
Exit status: 0 when every binary passed, 1 otherwise.
"""

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DURATIONS = ROOT / "scripts" / "test-durations.txt"
RESULT = re.compile(r"^test result: (\w+)\. (\d+) passed; (\d+) failed; (\d+) ignored")
FAILED_TEST = re.compile(r"^test (\S+) \.\.\. FAILED$")


def say(msg):
    print(msg, flush=True)


def test_binaries():
    """(package, kind, name, executable, manifest dir) of every test binary cargo built."""
    cmd = ["cargo", "test", "--workspace", "--no-run", "--message-format=json-render-diagnostics"]
    out = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, check=True, text=True).stdout
    found = []
    for line in out.splitlines():
        try:
            msg = json.loads(line)
        except json.JSONDecodeError:
            continue
        if msg.get("reason") != "compiler-artifact" or not msg.get("executable") or not msg["profile"].get("test"):
            continue
        target = msg["target"]
        package = msg["package_id"]
        # package_id is "path+file:///…/dir#name@version" (or "…#version" when the dir is the name).
        name_version = package.rsplit("#", 1)[-1]
        pkg = name_version.split("@")[0] if "@" in name_version else Path(package.split("#")[0]).name
        kind = target["kind"][0]
        found.append((pkg, kind, target["name"], msg["executable"], str(Path(target["src_path"]).parent), msg["manifest_path"]))
    return found


def shared_docker_names():
    """Binary key → "namespace/cluster" for end-to-end tests that create local (Docker)
    machines under fixed names: two binaries with the same pair would see each other's
    containers as leftovers (or remove them), so they never run at the same time."""
    groups = {}
    ns_re = re.compile(r'const (?:NS|NAMESPACE): &str = "([^"]+)"')
    cluster_re = re.compile(r'const CLUSTER: &str = "([^"]+)"')
    for src in sorted((ROOT / "tests" / "tests").glob("*.rs")):
        text = src.read_text(errors="replace")
        ns, cluster = ns_re.search(text), cluster_re.search(text)
        if ns and cluster:
            groups[f"provisioning-e2e/{src.stem}"] = f"{ns.group(1)}/{cluster.group(1)}"
    return groups


def known_durations():
    durations = {}
    if DURATIONS.exists():
        for line in DURATIONS.read_text().splitlines():
            parts = line.split()
            if len(parts) == 2 and not line.startswith("#"):
                durations[parts[0]] = float(parts[1])
    return durations


RUNNING = set()


def kill_group(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class Job:
    def __init__(self, key, argv, cwd, env):
        self.key, self.argv, self.cwd, self.env = key, argv, cwd, env
        self.passed = self.failed = self.ignored = 0
        self.status = None
        self.seconds = 0.0
        self.output = ""
        self.failed_tests = []


def run_job(job, log_dir):
    started = time.monotonic()
    log = log_dir / (job.key.replace("/", "__") + ".log")
    with open(log, "w") as f:
        # Its own session: whatever the binary leaves running when it exits or is killed
        # (a `provisioning dev`, moto, sshd, chromedriver) is killed with it, so one failed
        # test never leaves processes that disturb the next.
        proc = subprocess.Popen(
            job.argv, cwd=job.cwd, env=job.env, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
        RUNNING.add(proc)
        try:
            job.status = proc.wait()
        finally:
            kill_group(proc)
            RUNNING.discard(proc)
    job.seconds = time.monotonic() - started
    job.output = log.read_text(errors="replace")
    for line in job.output.splitlines():
        f = FAILED_TEST.match(line)
        if f:
            job.failed_tests.append(f.group(1))
        m = RESULT.match(line)
        if m:
            job.passed += int(m.group(2))
            job.failed += int(m.group(3))
            job.ignored += int(m.group(4))
    # A binary that crashed or was killed before its summary counts as one failure.
    if job.status != 0 and job.failed == 0:
        job.failed = 1


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lanes", type=int, default=int(os.environ.get("PROVISIONING_TEST_LANES", "3")))
    parser.add_argument("--only", action="append", default=[], help="PKG/BINARY (repeatable); default: all")
    parser.add_argument("--package", action="append", default=[], help="every test binary of PKG (repeatable)")
    parser.add_argument("--repeat", type=int, default=1, help="run the selection N times (determinism runs)")
    parser.add_argument("--no-doc", action="store_true", help="skip the doc tests")
    parser.add_argument("test_args", nargs="*")
    args = parser.parse_args()

    t0 = time.monotonic()
    binaries = test_binaries()
    durations = known_durations()
    base_env = dict(os.environ)
    jobs = []
    for rnd in range(args.repeat):
        for pkg, kind, name, exe, _src, manifest in binaries:
            key = f"{pkg}/{name}" if kind == "test" else f"{pkg}/{kind}:{name}"
            selected = key in args.only or f"{pkg}/{name}" in args.only or pkg in args.package
            if (args.only or args.package) and not selected:
                continue
            env = dict(base_env)
            pkg_dir = str(Path(manifest).parent)
            env.update({"CARGO_MANIFEST_DIR": pkg_dir, "CARGO_PKG_NAME": pkg, "CARGO_CRATE_NAME": name.replace("-", "_")})
            suffix = f"#{rnd + 1}" if args.repeat > 1 else ""
            jobs.append(Job(key + suffix, [exe, *args.test_args], pkg_dir, env))
        if not args.only and not args.package and not args.no_doc:
            suffix = f"#{rnd + 1}" if args.repeat > 1 else ""
            jobs.append(Job("doc-tests" + suffix, ["cargo", "test", "--workspace", "--doc", "--", *args.test_args], str(ROOT), dict(base_env)))
    say(f"run-tests: {len(jobs)} test binaries in {args.lanes} lanes (listed in {time.monotonic() - t0:.0f}s)")
    jobs.sort(key=lambda j: -durations.get(j.key.split("#")[0], 1.0))

    log_dir = ROOT / "target" / "test-logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    lock = threading.Condition()
    started = time.monotonic()
    groups = shared_docker_names()
    busy = set()  # groups (shared Docker names) of the binaries running now

    def next_job(queue):
        """The longest queued job whose Docker names are not in use; None when the queue is
        empty. Waits while every queued job shares names with a running one."""
        while queue:
            for i, job in enumerate(queue):
                group = groups.get(job.key.split("#")[0])
                if group is None or group not in busy:
                    if group is not None:
                        busy.add(group)
                    return queue.pop(i)
            lock.wait()
        return None

    def lane(queue):
        while True:
            with lock:
                job = next_job(queue)
                if job is None:
                    return
            run_job(job, log_dir)
            with lock:
                busy.discard(groups.get(job.key.split("#")[0]))
                lock.notify_all()
                mark = "ok" if job.status == 0 else "FAILED"
                say(f"\n===== {job.key}: {mark} ({job.passed} passed, {job.failed} failed, {job.ignored} ignored) in "
                    f"{job.seconds:.1f}s, at {time.monotonic() - started:.0f}s =====")
                sys.stdout.write(job.output)
                sys.stdout.flush()

    def stop(signum, _frame):
        for proc in list(RUNNING):
            kill_group(proc)
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    # Rounds run back to back: two copies of one binary never run at once (tests that share
    # a namespace, such as the examples in `default`, check for an earlier run's leftovers).
    for rnd in range(args.repeat):
        suffix = f"#{rnd + 1}" if args.repeat > 1 else ""
        queue = [j for j in jobs if (j.key.endswith(suffix) if suffix else True)]
        if args.repeat > 1:
            say(f"run-tests: round {rnd + 1} of {args.repeat}")
        threads = [threading.Thread(target=lane, args=(queue,)) for _ in range(max(1, args.lanes))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    wall = time.monotonic() - started
    passed = sum(j.passed for j in jobs)
    failed = sum(j.failed for j in jobs)
    ignored = sum(j.ignored for j in jobs)
    say("\n===== test binaries by time =====")
    for j in sorted(jobs, key=lambda j: -j.seconds):
        say(f"{j.seconds:8.1f}s  {'ok    ' if j.status == 0 else 'FAILED'}  {j.key}  ({j.passed} passed, {j.failed} failed)")
    failures = [j.key for j in jobs if j.status != 0]
    if failures:
        say("failed binaries: " + ", ".join(failures))
    if args.repeat > 1 or failures:
        # Per test: in how many of the runs it failed (determinism runs read this).
        counts = {}
        for j in jobs:
            for t in j.failed_tests or ([] if j.status == 0 else ["(binary exited before its summary)"]):
                counts.setdefault(f"{j.key.split('#')[0]}::{t}", []).append(j.key.split("#")[-1] if "#" in j.key else "1")
        say(f"===== failures by test over {args.repeat} run(s) =====")
        for test, runs in sorted(counts.items()):
            say(f"{len(runs)}/{args.repeat}  {test}  (runs {', '.join(runs)})")
        if not counts:
            say("none")
    say(f"run-tests: {len(jobs)} binaries, {sum(j.seconds for j in jobs):.0f}s of test time in {wall:.0f}s wall ({args.lanes} lanes)")
    if ignored:
        say(f"{ignored} ignored")
    say(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 and not failures else 1


if __name__ == "__main__":
    sys.exit(main())
