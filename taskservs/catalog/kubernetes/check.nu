# kubernetes health: kubelet is active; on control planes the API answers /readyz and this
# node is Ready.

use ../lib/ctx.nu *
use common.nu *

def main [] {
    let ctx = ($in | read-context)
    require-command systemctl "kubernetes runs only on machines with systemd"
    require-command kubeadm "kubernetes is not installed on this server"
    if (^systemctl is-active --quiet kubelet | complete | get exit_code) != 0 { fail "kubelet is not active" }
    let role = (role $ctx)
    if $role != "worker" {
        let ready = (kubectl get --raw /readyz)
        if $ready.exit_code != 0 { fail $"API server not ready: ($ready.stderr)" --code 2 }
        let node = (kubectl get node $ctx.server.name -o "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}")
        if ($node.stdout | str trim) != "True" { fail $"node ($ctx.server.name) is not Ready" --code 2 }
    }
    if $role == "init" {
        ensure-join-token $ctx
        # The admin kubeconfig for the Secret <cluster>-kubeconfig (rotated CA, new endpoint).
        export-kubeconfig
    }
    emit-result {healthy: true, version: $ctx.taskserv.version, role: $role}
}
