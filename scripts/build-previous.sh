#!/usr/bin/env bash
# Builds the previous release's `provisioning` binary for the upgrade and rollback test
# (tests/tests/upgrade_rollback.rs), next to what it reads from disk at run time:
#
#   target/previous/<rev>/provisioning          the binary (`provisioning-cli`'s bin)
#   target/previous/<rev>/crds.yaml             its CRDs (deploy/crds/crds.yaml at that commit)
#   target/previous/<rev>/taskservs/catalog/    its taskserv catalog (the binary reads
#   target/previous/<rev>/taskservs/templates/  $PROVISIONING_CATALOG, else the source tree it
#                                               was built in, which is gone: pass the env var)
#   target/previous/<rev>/env                   PROVISIONING_PREVIOUS_BIN=… (for `source`)
#
# Idempotent: an existing, complete output is reused. The commit is checked out in a temporary
# `git worktree add --detach` (removed afterwards) and built with its OWN target dir
# (target/previous/build), seeded from target/debug's dependency artifacts so that only the
# workspace crates compile: the shared target/debug must never receive the old workspace
# crates (cargo names path crates by their path relative to the workspace root, so the old
# and the new crates would overwrite each other there).
#
# Usage: scripts/build-previous.sh [REV]   (default: the previous release, below)
# Prints the path of the binary on stdout; progress and the time taken on stderr.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
# The previous release: the last release of main before this one.
PREVIOUS_RELEASE=8f9d655a9bff2a6f5dab942fd4d40b4b2eec05b7
REV=${1:-$PREVIOUS_RELEASE}
started=$SECONDS
say() { echo "build-previous.sh: $*" >&2; }

# The previous release's source tree, cached in the repository for clones without its commit
# (a shallow CI checkout with no origin to fetch from): `git archive` of PREVIOUS_RELEASE,
# whose git tree id is PREVIOUS_TREE. It is used only when the commit itself is unavailable,
# and only after the unpacked files hash to exactly that tree (`git write-tree`).
ARCHIVE=$ROOT/.ci/previous-release.tar.xz
PREVIOUS_TREE=39763e59fbc057c2bd4dc4f5d423a348f6e7ea39
FROM=git
if ! git cat-file -e "$REV^{commit}" 2>/dev/null; then
  say "commit $REV is not in this clone (a shallow clone?); fetching it from origin"
  if ! git fetch --quiet --depth=1 origin "$REV" >&2 || ! git cat-file -e "$REV^{commit}" 2>/dev/null; then
    if [[ $REV == "$PREVIOUS_RELEASE" && -f $ARCHIVE ]]; then
      say "not fetched: using the cached source of $REV (.ci/previous-release.tar.xz), checked against its tree id"
      FROM=archive
    else
      say "ERROR: the previous release $REV is not available. Fetch it (\`git fetch origin $REV\`," \
        "or \`git fetch --unshallow\`), or clone with full history, then run scripts/build-previous.sh again."
      exit 1
    fi
  fi
fi
if [[ $FROM == git ]]; then FULL=$(git rev-parse "$REV^{commit}"); else FULL=$REV; fi
SHORT=${FULL:0:7}
OUT=$ROOT/target/previous/$SHORT
BUILD=$ROOT/target/previous/build
# The current tree's build (scripts/test.sh's build phase), where the dependencies come from.
DEBUG=${CARGO_TARGET_DIR:-$ROOT/target}/debug

if [[ -x $OUT/provisioning && -f $OUT/complete ]]; then
  say "reusing $OUT/provisioning ($(cat "$OUT/complete")); took $((SECONDS - started))s"
  echo "$OUT/provisioning"
  exit 0
fi

SRC=$(mktemp -d "${TMPDIR:-/tmp}/provisioning-previous-$SHORT.XXXXXX")
cleanup() {
  git -C "$ROOT" worktree remove --force "$SRC" >/dev/null 2>&1 || rm -rf "$SRC"
  git -C "$ROOT" worktree prune >/dev/null 2>&1 || true
}
trap cleanup EXIT
if [[ $FROM == git ]]; then
  rmdir "$SRC"
  git worktree add --quiet --detach "$SRC" "$FULL" >&2
else
  tar -xJf "$ARCHIVE" -C "$SRC"
  # Exactly the release's files: the same git tree id, computed in a throwaway repository.
  TREE=$(cd "$SRC" && git init --quiet && git add --all --force && git write-tree)
  rm -rf "$SRC/.git"
  if [[ $TREE != "$PREVIOUS_TREE" ]]; then
    say "ERROR: .ci/previous-release.tar.xz holds tree $TREE, not $REV's tree $PREVIOUS_TREE: recreate it with" \
      "\`git archive --format=tar $REV | xz -9 > .ci/previous-release.tar.xz\`"
    exit 1
  fi
fi

# What is built, here and at the previous release: the binary, selected across the workspace
# and with one small test target (provisioning-yaml's call_sites), so that cargo resolves the
# dependencies' features as `cargo build --workspace --all-targets` (scripts/test.sh's build
# phase) does: every member's dependencies and dev-dependencies unified. `-p
# provisioning-cli --bin provisioning` alone resolves tokio, syn, time and others with fewer
# features, and then most dependencies compile again under other hashes.
SELECTION=(--locked --workspace --bin provisioning --test call_sites)

# Seed the private target dir with the dependency artifacts this tree's build of the same
# selection uses (cargo lists them: `--message-format=json` of a build that is fresh after
# scripts/test.sh's build phase), copied with their mtimes, fingerprints and build-script
# outputs, so that they are fresh there too and only the workspace crates (and a dependency
# whose features differ at that commit) compile. Only what the binary needs is copied, not the
# whole target/debug (test binaries, stale versions). Done once; later runs (another revision)
# find it seeded.
mkdir -p "$BUILD/debug"
if [[ ! -f $BUILD/seeded ]]; then
  say "listing the dependency artifacts of provisioning in target/debug"
  list=$(mktemp)
  cargo build "${SELECTION[@]}" --message-format=json |
    python3 -c '
import json, os, re, sys
debug = sys.argv[1]
hashes = set()
for line in sys.stdin:
    try:
        msg = json.loads(line)
    except ValueError:
        continue
    # Workspace crates (path packages) compile anyway; only dependencies are seeded.
    if msg.get("package_id", "").startswith("path+"):
        continue
    paths = msg.get("filenames") or [] if msg.get("reason") == "compiler-artifact" else [msg.get("out_dir") or ""]
    for path in paths:
        hashes.update(re.findall(r"-([0-9a-f]{16})(?=[./]|$)", path))
for sub in ("deps", "build", ".fingerprint"):
    for name in sorted(os.listdir(os.path.join(debug, sub))):
        found = re.search(r"-([0-9a-f]{16})(?=\.|$)", name)
        if found and found.group(1) in hashes:
            print(os.path.join(sub, name))
' "$DEBUG" >"$list"
  (cd "$DEBUG" && tar -cf - -T "$list") | tar -xf - -C "$BUILD/debug"
  say "seeded $BUILD with $(wc -l <"$list") dependency artifacts ($(du -sh "$BUILD" | cut -f1))"
  rm -f "$list"
  touch "$BUILD/seeded"
fi

load=$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo "?")
say "building provisioning at $SHORT in $SRC (load average before: $load)"
build_started=$SECONDS
(cd "$SRC" && CARGO_INCREMENTAL=0 cargo build "${SELECTION[@]}" --target-dir "$BUILD" >&2)
build_took=$((SECONDS - build_started))

mkdir -p "$OUT.tmp"
rm -rf "${OUT:?}.tmp"/*
cp "$BUILD/debug/provisioning" "$OUT.tmp/provisioning"
cp "$SRC/deploy/crds/crds.yaml" "$OUT.tmp/crds.yaml"
mkdir -p "$OUT.tmp/taskservs"
cp -r "$SRC/taskservs/catalog" "$OUT.tmp/taskservs/catalog"
if [[ -d $SRC/taskservs/templates ]]; then cp -r "$SRC/taskservs/templates" "$OUT.tmp/taskservs/templates"; fi
echo "PROVISIONING_PREVIOUS_BIN=$OUT/provisioning" >"$OUT.tmp/env"
echo "$FULL built in ${build_took}s (load average before: $load)" >"$OUT.tmp/complete"
rm -rf "$OUT"
mv "$OUT.tmp" "$OUT"
# The build dir is not read again once the output exists (1.6 GB on 2026-11-27: the seeded
# dependencies and the old workspace crates); a build of another revision seeds it again.
rm -rf "$BUILD"
say "built $OUT/provisioning in ${build_took}s; target/previous is $(du -sh "$ROOT/target/previous" | cut -f1); took $((SECONDS - started))s"
echo "$OUT/provisioning"
