#!/usr/bin/env bash
# The whole test suite, as CI runs it: installs what is missing (scripts/setup.sh), builds,
# builds the local node image if its recipe changed and the controller image, then runs
# every test. Tests that need
# Docker, nu, kubectl or moto run for real; none of them skips.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# shellcheck disable=SC1091
source .tools/env
export RUST_BACKTRACE=1
cargo build --workspace --all-targets
if ./target/debug/provisioning image build --help >/dev/null 2>&1; then
  ./target/debug/provisioning image build
fi
# The controller image deploy/ names (tests/tests/deployed_controller.rs runs it); built once
# here, cached by cargo and the engine, so an unchanged tree costs seconds.
bash scripts/build-image.sh >/dev/null
cargo test --workspace --no-fail-fast "$@"
