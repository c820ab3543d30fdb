# haproxy removal: stop and purge.

use ../lib/ctx.nu *
use ../lib/files.nu *
use ../lib/pkg.nu *
use ../lib/service.nu *

def main [] {
    let ctx = ($in | read-context)
    svc-stop haproxy --unit haproxy
    apt-purge haproxy
    rm -rf /etc/haproxy
    forget-config haproxy
    emit-result {removed: true}
}
