# buildah removal: purge, delete the isolation setting, the store (when podman does not share
# it) and the drift baseline.

use ../lib/ctx.nu *
use ../lib/pkg.nu *
use ../lib/files.nu *
use ../lib/containers.nu *

def main [] {
    let ctx = ($in | read-context)
    apt-purge buildah
    rm -f /etc/profile.d/provisioning-buildah.sh
    if (installed-version podman) == null { rm -rf $STORAGE_CONF /var/lib/containers/storage /run/containers/storage }
    forget-config buildah
    emit-result {removed: true}
}
