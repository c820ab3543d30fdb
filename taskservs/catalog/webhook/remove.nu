# webhook removal: stop, purge, delete hooks, flags, drop-in and the drift baseline.

use ../lib/ctx.nu *
use ../lib/pkg.nu *
use ../lib/files.nu *
use ../lib/service.nu *
use common.nu *

def main [] {
    let ctx = ($in | read-context)
    svc-stop webhook --unit webhook
    apt-purge webhook
    rm -rf $HOOKS $DEFAULTS ($DROPIN | path dirname)
    forget-config webhook
    emit-result {removed: true}
}
