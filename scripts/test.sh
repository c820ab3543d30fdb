#!/usr/bin/env bash
# The whole test suite, as CI runs it: installs what is missing (scripts/setup.sh), builds,
# builds the local node image if its recipe changed and the controller image, then runs
# every test. Tests that need
# Docker, nu, kubectl or moto run for real; none of them skips.
set -euo pipefail
cd "$(dirname "$0")/.."
# Each phase's time, printed as it ends and again at the end.
PHASES=()
phase_start=$SECONDS
phase() { # name: ends the running phase under that name
  local took=$((SECONDS - phase_start))
  PHASES+=("$(printf '%-28s %4dm%02ds' "$1" $((took / 60)) $((took % 60)))")
  echo "test.sh: phase $1 took $((took / 60))m$((took % 60))s" >&2
  phase_start=$SECONDS
}
bash scripts/setup.sh
# shellcheck disable=SC1091
source .tools/env
export RUST_BACKTRACE=1
phase setup
# Gates: formatting (rustfmt.toml) and every clippy lint as an error (the crates deny
# clippy::unwrap_used outside tests, so that is enforced here too).
for component in rustfmt clippy; do
  if ! cargo "${component/rustfmt/fmt}" --version >/dev/null 2>&1; then
    rustup component add "$component" >&2 || { echo "test.sh: cargo ${component/rustfmt/fmt} is missing and rustup could not add it" >&2; exit 1; }
  fi
done
cargo fmt --check
cargo build --workspace --all-targets
phase build
# The previous release's binary for the upgrade and rollback test
# (tests/tests/upgrade_rollback.rs): built by scripts/build-previous.sh in its own target dir
# (seeded from target/debug, so only the workspace crates compile) and reused once built.
PROVISIONING_PREVIOUS_BIN=$(bash scripts/build-previous.sh)
export PROVISIONING_PREVIOUS_BIN
phase previous
cargo clippy --workspace --all-targets -- -D warnings
# No import circles between the modules of any crate (from the sources; seconds).
python3 scripts/check-module-cycles.py
# Dependency licences against an allow-list and no new duplicate versions
# (scripts/dependency-policy.toml; cargo metadata offline; seconds), after the checker's tests.
python3 scripts/test_licences.py -q
python3 scripts/licences.py check
phase clippy
if ./target/debug/provisioning image build --help >/dev/null 2>&1; then
  ./target/debug/provisioning image build
fi
# The controller image deploy/ names (tests/tests/deployed_controller.rs runs it); built once
# here around the binary just built (stripped), so CI does not compile every dependency a
# second time under the optimised `image` profile (7-13 min on 2 cores); cached by the engine,
# so an unchanged tree costs seconds. scripts/build-image.sh alone builds the optimised one.
bash scripts/build-image.sh --binary target/debug/provisioning >/dev/null
phase images
# Every test binary, in parallel lanes (scripts/run-tests.py: most of the suite waits on
# Docker, nu and the embedded control plane, not on the CPU). Arguments go to the runner
# (`--lanes N`, `--only PKG/BINARY`, `--repeat N`, `-- FILTER`).
status=0
python3 scripts/run-tests.py "$@" || status=$?
phase tests
echo "test.sh: phases" >&2
printf '  %s\n' "${PHASES[@]}" >&2
exit "$status"
