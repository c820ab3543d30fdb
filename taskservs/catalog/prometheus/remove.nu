# prometheus removal: stop, purge, delete config, samples and the drift baseline.

use ../lib/ctx.nu *
use ../lib/pkg.nu *
use ../lib/files.nu *
use ../lib/service.nu *
use common.nu *

def main [] {
    let ctx = ($in | read-context)
    svc-stop prometheus --unit prometheus
    apt-purge prometheus
    rm -rf $CONFIG $RULES $WEB $DEFAULTS /var/lib/prometheus/metrics2
    forget-config prometheus
    emit-result {removed: true}
}
