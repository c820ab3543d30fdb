# docker-registry removal: stop, purge, delete config, images and the drift baseline.

use ../lib/ctx.nu *
use ../lib/pkg.nu *
use ../lib/files.nu *
use ../lib/service.nu *

def main [] {
    let ctx = ($in | read-context)
    svc-stop docker-registry --unit docker-registry
    apt-purge docker-registry
    rm -rf /etc/docker/registry /var/lib/docker-registry
    forget-config docker-registry
    emit-result {removed: true}
}
