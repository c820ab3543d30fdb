# docker removal: stop dockerd, purge, delete daemon.json, its data and the drift baseline.

use ../lib/ctx.nu *
use ../lib/pkg.nu *
use ../lib/files.nu *
use ../lib/service.nu *
use common.nu *

def main [] {
    let ctx = ($in | read-context)
    svc-stop docker --unit docker --grace 20sec
    apt-purge docker.io
    rm -rf $CONFIG /var/lib/docker /run/docker $SOCKET
    forget-config docker
    emit-result {removed: true}
}
