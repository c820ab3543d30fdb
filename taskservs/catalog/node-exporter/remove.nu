# node-exporter removal: stop, purge, delete the flags file and the drift baseline.

use ../lib/ctx.nu *
use ../lib/pkg.nu *
use ../lib/files.nu *
use ../lib/service.nu *
use common.nu *

def main [] {
    let ctx = ($in | read-context)
    svc-stop node-exporter --unit prometheus-node-exporter
    apt-purge prometheus-node-exporter
    rm -f $DEFAULTS
    forget-config node-exporter
    emit-result {removed: true}
}
