# rook-ceph removal: delete the CephCluster, then the operator and CRDs. Rook keeps data in
# dataDirHostPath on the nodes; wiping disks is left to the operator's cleanup policy.

use ../lib/ctx.nu *
use ../lib/k8s.nu *

def main [] {
    let ctx = ($in | read-context)
    if (is-api-runner $ctx $ctx.config.controlPlanePool) and ($ADMIN_CONF | path exists) {
        kube -n rook-ceph delete cephcluster rook-ceph --ignore-not-found --wait=true --timeout=600s | ignore
        kube delete namespace rook-ceph --ignore-not-found --timeout=600s | ignore
    }
    emit-result {removed: true}
}
