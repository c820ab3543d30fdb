# coredns removal: scale kube-system/coredns to zero (kubeadm owns the deployment; deleting it
# would fight `kubeadm upgrade`).

use ../lib/ctx.nu *
use ../lib/k8s.nu *

def main [] {
    let ctx = ($in | read-context)
    if (is-api-runner $ctx $ctx.config.controlPlanePool) and ($ADMIN_CONF | path exists) {
        kube -n kube-system scale deployment/coredns --replicas=0 | ignore
    }
    emit-result {removed: true}
}
