# keepalived removal: stop (a MASTER releases the address), purge, delete the config and
# the drift baseline.

use ../lib/ctx.nu *
use ../lib/pkg.nu *
use ../lib/files.nu *
use ../lib/service.nu *
use common.nu *

def main [] {
    let ctx = ($in | read-context)
    svc-stop keepalived --unit keepalived
    apt-purge keepalived
    rm -rf /etc/keepalived $PID
    forget-config keepalived
    emit-result {removed: true}
}
