# alertmanager removal: stop, purge, delete config, state and the drift baseline.

use ../lib/ctx.nu *
use ../lib/pkg.nu *
use ../lib/files.nu *
use ../lib/service.nu *
use common.nu *

def main [] {
    let ctx = ($in | read-context)
    svc-stop alertmanager --unit prometheus-alertmanager
    apt-purge prometheus-alertmanager
    rm -rf $CONFIG $WEB $DEFAULTS /var/lib/prometheus/alertmanager
    forget-config alertmanager
    emit-result {removed: true}
}
