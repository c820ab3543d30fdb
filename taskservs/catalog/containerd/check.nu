# containerd health: the daemon runs and answers `ctr version` on its socket.

use ../lib/ctx.nu *
use ../lib/service.nu *
use common.nu *

def main [] {
    let ctx = ($in | read-context)
    if not (svc-running containerd --unit containerd) { fail "containerd is not running" }
    let server = (server-version)
    if $server == null { fail $"containerd does not answer on ($SOCKET)" --code 2 }
    emit-result {healthy: true, version: $ctx.taskserv.version, serverVersion: $server}
}
