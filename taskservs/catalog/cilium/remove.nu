# cilium removal: `cilium uninstall` from the first control plane (idempotent).

use ../lib/ctx.nu *
use ../lib/k8s.nu *

def main [] {
    let ctx = ($in | read-context)
    if (is-api-runner $ctx $ctx.config.controlPlanePool) and ((which cilium | length) > 0) and ($ADMIN_CONF | path exists) {
        with-env {KUBECONFIG: $ADMIN_CONF} { ^cilium uninstall --wait | complete | ignore }
    }
    emit-result {removed: true}
}
