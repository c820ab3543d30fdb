#!/usr/bin/env bash
# Regenerates the Argo CD files made from deploy/argocd/src (the one source of the Lua
# scripts every kind shares): each kind's copies under
# deploy/argocd/resource_customizations/provisioning.dev/<Kind>/ and
# deploy/argocd/argocd-cm-patch.yaml. The generator is the deploy-checks test that also fails
# when a committed copy differs; afterwards every Argo CD test runs on the new files.
set -euo pipefail
cd "$(dirname "$0")/.."
UPDATE_ARGOCD=1 cargo test -p provisioning-deploy-checks --test argocd generated_copies_and_patch_match_the_one_source
cargo test -p provisioning-deploy-checks --test argocd
