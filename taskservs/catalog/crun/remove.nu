# crun removal: purge and delete the runtime registration and the drift baseline.

use ../lib/ctx.nu *
use ../lib/pkg.nu *
use ../lib/files.nu *

def main [] {
    let ctx = ($in | read-context)
    apt-purge crun
    rm -f /etc/containers/containers.conf.d/50-provisioning-crun.conf
    forget-config crun
    emit-result {removed: true}
}
