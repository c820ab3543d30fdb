#!/usr/bin/env bash
# Builds the controller image from the repository's Dockerfile and tags it exactly as
# deploy/controller/deployment.yaml names it (prints that reference on stdout).
#
#   scripts/build-image.sh                  # build here, no registry needed
#   scripts/build-image.sh --binary FILE    # the same around an already built `provisioning`
#   scripts/build-image.sh --registry       # plain `docker build` (base and toolchain pulled)
#
# Without --registry nothing is pulled: the binary is built on this host (cargo profile
# `image`), nu comes from .tools/bin/nu (scripts/setup.sh), both are handed to the Dockerfile
# through PREBUILT with the CA roots and the notice (scripts/licences.py notice), and when the
# Debian base (debian:12-slim, where the image's shared libraries come from) is not present it
# is bootstrapped with debootstrap from the host's own apt mirror and imported under that name.
# Every step is cached: a second run with nothing changed takes seconds. The image's size is
# printed at the end; the optimised image (no --binary) fails the build over MAX_MB.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
DOCKER=${PROVISIONING_DOCKER:-docker}
log() { echo "build-image: $*" >&2; }

IMAGE=$(awk '$1 == "image:" || ($1 == "-" && $2 == "image:") { print $NF; exit }' deploy/controller/deployment.yaml)
[ -n "$IMAGE" ] || { log "no image: in deploy/controller/deployment.yaml"; exit 1; }
BASE=$(awk -F= '/^ARG BASE=/ { print $2; exit }' Dockerfile)
[ -n "$BASE" ] || { log "no ARG BASE= in Dockerfile"; exit 1; }

# --binary FILE: scripts/test.sh hands in the test build's binary (stripped here), so CI does
# not compile the whole dependency tree a second time under the `image` profile.
BINARY=
if [ "${1:-}" = "--binary" ]; then
  BINARY=${2:-}
  [ -n "$BINARY" ] && [ -x "$BINARY" ] || { log "--binary needs an executable file (got '${BINARY}')"; exit 1; }
fi

# The optimised image's budget (issue 30): decimal MB, as `docker image ls` prints them.
MAX_MB=150
# OCI labels: the workspace's version and the commit built.
VERSION=$(awk -F'"' '/^\[workspace.package\]/ { p = 1 } p && /^version *=/ { print $2; exit }' Cargo.toml)
REVISION=$(git rev-parse HEAD 2>/dev/null || echo unknown)
if [ "$REVISION" != unknown ] && [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then
  REVISION="$REVISION-dirty"
fi
LABELS=(--build-arg "VERSION=${VERSION:-unknown}" --build-arg "REVISION=$REVISION")

# Prints the image's size; over MAX_MB fails when $1 is "optimised" (the `image` profile's
# binary; a --binary one, such as CI's debug build, has no budget).
report_size() {
  local size mb
  size=$("$DOCKER" image inspect -f '{{.Size}}' "$IMAGE")
  mb=$(( (size + 500000) / 1000000 ))
  log "$IMAGE: $mb MB ($size bytes; $1 binary), built in $(( $(date +%s) - START )) s"
  if [ "$1" = optimised ] && [ "$size" -gt $(( MAX_MB * 1000000 )) ]; then
    log "$IMAGE is over the ${MAX_MB} MB budget: see docs/benchmarks.md#the-controller-image for what each part costs"
    exit 1
  fi
}
START=$(date +%s)

if [ "${1:-}" = "--registry" ]; then
  "$DOCKER" build "${LABELS[@]}" -t "$IMAGE" .
  report_size optimised
  echo "$IMAGE"
  exit 0
fi

# Debian release of the base: debian:12-slim -> bookworm.
case "$BASE" in
  debian:12*|debian:bookworm*) SUITE=bookworm ;;
  debian:13*|debian:trixie*) SUITE=trixie ;;
  *) log "do not know how to bootstrap base $BASE locally; pull it or use --registry"; exit 1 ;;
esac

# The first apt mirror of the host that serves $SUITE main (deb822 or one-line format).
host_mirror() {
  local f
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    awk -v suite="$SUITE" '
      BEGIN { RS = ""; FS = "\n" }
      {
        uris = ""; ok_suite = 0; ok_type = 0; ok_comp = 0
        for (i = 1; i <= NF; i++) {
          if ($i ~ /^URIs:/) { sub(/^URIs:[ \t]*/, "", $i); split($i, u, /[ \t]+/); uris = u[1] }
          if ($i ~ /^Types:/ && $i ~ /(^|[ \t])deb([ \t]|$)/) ok_type = 1
          if ($i ~ /^Suites:/ && $i ~ ("[ \t]" suite "([ \t]|$)")) ok_suite = 1
          if ($i ~ /^Components:/ && $i ~ /[ \t]main([ \t]|$)/) ok_comp = 1
        }
        if (uris != "" && ok_suite && ok_type && ok_comp) { print uris; exit }
      }' "$f"
  done
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] || continue
    awk -v suite="$SUITE" '$1 == "deb" { i = 2; if ($2 ~ /^\[/) { while ($i !~ /\]$/) i++; i++ } if ($(i+1) == suite) { print $i; exit } }' "$f"
  done
}

# The base, bootstrapped like the official slim image (minbase, no docs/man/locales, but the
# packages' copyright files, which the image ships for the libraries it takes) when the engine
# does not have it, or has an older local bootstrap without the copyright files.
CACHE=${PROVISIONING_DATA_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/provisioning}
base_usable() {
  "$DOCKER" image inspect "$BASE" >/dev/null 2>&1 || return 1
  case "$("$DOCKER" image inspect -f '{{.Comment}}' "$BASE")" in
    "local bootstrap of"*) "$DOCKER" run --rm --network none --entrypoint /bin/sh "$BASE" -c 'test -f /usr/share/doc/libc6/copyright' ;;
    *) return 0 ;;
  esac
}
if ! base_usable; then
  MIRROR=$(host_mirror | head -n 1)
  [ -n "$MIRROR" ] || { log "no apt source on this host serves Debian $SUITE main; cannot bootstrap $BASE"; exit 1; }
  log "$BASE not present (or a local bootstrap without copyright files): bootstrapping Debian $SUITE (minbase) from $MIRROR"
  command -v debootstrap >/dev/null || { log "debootstrap missing (apt-get install debootstrap)"; exit 1; }
  mkdir -p "$CACHE/debootstrap-cache/$SUITE"
  ROOTFS=$(mktemp -d "${TMPDIR:-/tmp}/provisioning-base.XXXXXX")
  trap 'rm -rf "$ROOTFS"' EXIT
  debootstrap --variant=minbase --cache-dir="$CACHE/debootstrap-cache/$SUITE" "$SUITE" "$ROOTFS" "$MIRROR" >&2
  # What the official slim variant leaves out, and apt's downloaded lists.
  find "$ROOTFS"/usr/share/doc -mindepth 1 ! -type d ! -type l ! -name copyright -delete
  find "$ROOTFS"/usr/share/doc -mindepth 1 -type d -empty -delete
  rm -rf "$ROOTFS"/usr/share/man/* "$ROOTFS"/usr/share/info/* \
         "$ROOTFS"/usr/share/locale/* "$ROOTFS"/usr/share/groff/* "$ROOTFS"/usr/share/lintian/* \
         "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/var/cache/apt/*.bin "$ROOTFS"/var/cache/apt/archives/*.deb \
         "$ROOTFS"/var/log/*.log "$ROOTFS"/var/log/apt/*
  tar --numeric-owner -C "$ROOTFS" -cf - . | "$DOCKER" import -c 'CMD ["bash"]' -m "local bootstrap of $BASE (Debian $SUITE minbase)" - "$BASE" >&2
  rm -rf "$ROOTFS"
  trap - EXIT
fi

# The binary (cargo's own cache makes this a no-op when nothing changed), nu, the CA roots and
# the notice.
PROFILE=given
if [ -z "$BINARY" ]; then
  PROFILE=optimised
  cargo build --locked --profile image -p provisioning-cli --bin provisioning >&2
  BINARY=${CARGO_TARGET_DIR:-$ROOT/target}/image/provisioning
fi
NU=${PROVISIONING_NU:-$ROOT/.tools/bin/nu}
[ -x "$NU" ] || { log "nu not found at $NU (run scripts/setup.sh)"; exit 1; }
STAGE=$ROOT/.image-build
mkdir -p "$STAGE"
# Copy only on change, so the build context (and the engine's layer cache) stays the same.
update() { cmp -s "$1" "$2" 2>/dev/null || cp "$1" "$2"; }
# The image profile strips already; a handed-in binary may carry debug info.
cp "$BINARY" "$STAGE/provisioning.tmp" && strip "$STAGE/provisioning.tmp"
update "$STAGE/provisioning.tmp" "$STAGE/provisioning"
rm -f "$STAGE/provisioning.tmp"
if [ ! -f "$STAGE/nu" ] || [ "$NU" -nt "$STAGE/nu" ]; then
  cp "$NU" "$STAGE/nu.tmp" && strip "$STAGE/nu.tmp" 2>/dev/null || true
  mv "$STAGE/nu.tmp" "$STAGE/nu"
fi
update /etc/ssl/certs/ca-certificates.crt "$STAGE/ca-certificates.crt"
# nu's licence, from the npm package scripts/setup.sh installed it from.
NU_VERSION=$(awk -F= '/^ARG NUSHELL_VERSION=/ { print $2; exit }' Dockerfile)
NU_LICENCE=
for f in "$(dirname "$NU")"/../npm/node_modules/@nushell/*/LICENSE "$(dirname "$NU")"/../npm/node_modules/nushell/LICENSE; do
  [ -f "$f" ] && { NU_LICENCE=$f; break; }
done
[ -n "$NU_LICENCE" ] || { log "nu's LICENSE not found next to $NU (.tools/npm; run scripts/setup.sh)"; exit 1; }
python3 scripts/licences.py notice --bundled "nushell $NU_VERSION MIT $NU_LICENCE" > "$STAGE/NOTICE.tmp"
update "$STAGE/NOTICE.tmp" "$STAGE/NOTICE"
rm -f "$STAGE/NOTICE.tmp"

"$DOCKER" build -q --build-arg "BUILDER=$BASE" --build-arg PREBUILT=.image-build "${LABELS[@]}" -t "$IMAGE" . >&2
report_size "$PROFILE"
echo "$IMAGE"
