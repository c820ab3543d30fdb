# kubernetes removal: drain and delete this node through the API when it still answers, then
# `kubeadm reset` and purge the packages.

use ../lib/ctx.nu *
use ../lib/pkg.nu *
use common.nu *

def main [] {
    let ctx = ($in | read-context)
    if (installed-version kubeadm) != null {
        if ($ADMIN_CONF | path exists) {
            kubectl drain $ctx.server.name --ignore-daemonsets --delete-emptydir-data --force --timeout=120s | ignore
            kubectl delete node $ctx.server.name --ignore-not-found | ignore
        }
        ^kubeadm reset -f | complete | ignore
    }
    ^apt-mark unhold kubelet kubeadm kubectl | complete | ignore
    apt-purge kubelet kubeadm kubectl
    rm -rf /etc/kubernetes /var/lib/kubelet /var/lib/etcd /etc/cni/net.d /etc/apt/sources.list.d/kubernetes.list
    emit-result {removed: true}
}
