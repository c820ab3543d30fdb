# cilium: install the cilium CLI (pinned), then `cilium install`/`upgrade` from the first
# control plane. Other servers only report.

use ../lib/ctx.nu *
use ../lib/k8s.nu *
use common.nu *

def main [] {
    let ctx = ($in | read-context)
    let version = $ctx.taskserv.version
    if not (is-api-runner $ctx $ctx.config.controlPlanePool) {
        log "not the first control plane: nothing to do on this server"
        emit-result {version: $version, acted: false}
        return
    }
    let cli = $ctx.config.cliVersion
    let have = (try { ^cilium version --client | complete | get stdout } catch { "" })
    if not ($have | str contains $cli) {
        log $"installing cilium CLI ($cli)"
        let tarball = "/tmp/cilium-linux-amd64.tar.gz"
        let pinned = ($ctx.config.cliSha256? | default {} | get -o $cli | default "")
        fetch $"https://github.com/cilium/cilium-cli/releases/download/($cli)/cilium-linux-amd64.tar.gz" $tarball --sha256 $pinned
        ^tar -xzf $tarball -C /usr/local/bin cilium
        rm -f $tarball
    }
    let settings = (helm-settings $ctx.config)
    let installed = ((kube -n kube-system get daemonset cilium | get exit_code) == 0)
    with-env {KUBECONFIG: $ADMIN_CONF} {
        if $installed {
            log $"cilium upgrade --version ($version)"
            ^cilium upgrade --version $version ...$settings
        } else {
            log $"cilium install --version ($version)"
            ^cilium install --version $version ...$settings
        }
        ^cilium status --wait --wait-duration 10m
    }
    emit-result {version: $version, acted: true}
}
