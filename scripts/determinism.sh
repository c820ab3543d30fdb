#!/usr/bin/env bash
# The suite proves its determinism (issue 32): the end-to-end and provider-contract tests run
# RUNS times back to back (default 5), then once more while a parallel cargo build loads the
# machine. Prints, per test, in how many runs it failed. Needs a built tree (scripts/test.sh
# or `cargo test --workspace --no-run`) and the node and controller images.
#   scripts/determinism.sh [RUNS] [--lanes N]
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck disable=SC1091
source .tools/env
RUNS=${1:-5}
shift || true
# The upgrade and rollback test runs the previous release (built once, then reused).
PROVISIONING_PREVIOUS_BIN=$(bash scripts/build-previous.sh)
export PROVISIONING_PREVIOUS_BIN
PACKAGES=(--package provisioning-e2e --package provisioning-providers)
status=0
echo "determinism: $RUNS runs back to back" >&2
python3 scripts/run-tests.py "${PACKAGES[@]}" --repeat "$RUNS" "$@" || status=1
echo "determinism: one run while a parallel build loads the machine" >&2
LOAD_DIR=$(mktemp -d)
( while true; do cargo build -q --target-dir "$LOAD_DIR" -p provisioning-apiserver >/dev/null 2>&1; rm -rf "$LOAD_DIR"; done ) &
load=$!
trap 'kill $load 2>/dev/null; pkill -f "target-dir $LOAD_DIR" 2>/dev/null; rm -rf "$LOAD_DIR"' EXIT
python3 scripts/run-tests.py "${PACKAGES[@]}" "$@" || status=1
exit "$status"
