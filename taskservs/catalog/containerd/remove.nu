# containerd removal: stop, purge containerd (runc stays: other runtimes may use it), delete state.

use ../lib/ctx.nu *
use ../lib/pkg.nu *
use ../lib/service.nu *
use common.nu *

def main [] {
    let ctx = ($in | read-context)
    svc-stop containerd --unit containerd
    apt-purge containerd
    rm -rf /var/lib/containerd /run/containerd /etc/containerd
    emit-result {removed: true}
}
