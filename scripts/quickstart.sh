#!/usr/bin/env bash
# Quick start on a fresh machine: installs what is missing, builds, and runs the embedded
# control plane with the controller, applying examples/simulated/ (a Workspace and three
# Servers on the simulated provider). Ctrl-C stops it. Point kubectl at it with the
# `export KUBECONFIG=...` line it prints; `kubectl get provisioning` lists everything.
# Pass other manifests to apply instead: scripts/quickstart.sh examples/local/etcd-cluster.yaml
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# shellcheck disable=SC1091
source .tools/env
cargo build --bin provisioning
manifests=("$@")
[ ${#manifests[@]} -gt 0 ] || manifests=(examples/simulated)
args=()
for m in "${manifests[@]}"; do args+=(--apply "$m"); done
exec ./target/debug/provisioning dev --data-dir .data "${args[@]}"
