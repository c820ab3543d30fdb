# coredns health: the deployment has its replicas available (checked from the first control plane).

use ../lib/ctx.nu *
use ../lib/k8s.nu *

def main [] {
    let ctx = ($in | read-context)
    if (is-api-runner $ctx $ctx.config.controlPlanePool) {
        let r = (kube -n kube-system get deployment coredns -o "jsonpath={.status.availableReplicas}")
        let available = ($r.stdout | str trim)
        if $r.exit_code != 0 or $available == "" or ($available | into int) < 1 { fail "coredns has no available replicas" --code 2 }
    }
    emit-result {healthy: true, version: $ctx.taskserv.version}
}
