# podman removal: stop the API service, purge, delete its settings, the store (when buildah
# does not share it) and the drift baseline.

use ../lib/ctx.nu *
use ../lib/pkg.nu *
use ../lib/files.nu *
use ../lib/service.nu *
use ../lib/containers.nu *
use common.nu *

def main [] {
    let ctx = ($in | read-context)
    svc-stop podman --unit podman.socket
    apt-purge podman
    rm -f $ENGINE_CONF $SOCKET
    if (installed-version buildah) == null { rm -rf $STORAGE_CONF /var/lib/containers/storage /run/containers/storage }
    forget-config podman
    emit-result {removed: true}
}
