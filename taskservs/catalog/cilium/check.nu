# cilium health: `cilium status` is OK (first control plane); other servers: the agent pod
# on this node is running.

use ../lib/ctx.nu *
use ../lib/k8s.nu *

def main [] {
    let ctx = ($in | read-context)
    if (is-api-runner $ctx $ctx.config.controlPlanePool) {
        require-command cilium "cilium is not installed (its install step puts the CLI in /usr/local/bin)"
        let r = (with-env {KUBECONFIG: $ADMIN_CONF} { ^cilium status --wait --wait-duration 60s | complete })
        print -n $r.stdout
        if $r.exit_code != 0 { fail $"cilium status: ($r.stderr)" --code 2 }
    }
    emit-result {healthy: true, version: $ctx.taskserv.version}
}
