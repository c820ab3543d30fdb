# rook-ceph health: the CephCluster reports HEALTH_OK (or HEALTH_WARN) from the first control plane.

use ../lib/ctx.nu *
use ../lib/k8s.nu *

def main [] {
    let ctx = ($in | read-context)
    if (is-api-runner $ctx $ctx.config.controlPlanePool) {
        let r = (kube -n rook-ceph get cephcluster rook-ceph -o "jsonpath={.status.ceph.health}")
        let health = ($r.stdout | str trim)
        if $health not-in [HEALTH_OK HEALTH_WARN] { fail $"ceph health is '($health)'" --code 2 }
    }
    emit-result {healthy: true, version: $ctx.taskserv.version}
}
