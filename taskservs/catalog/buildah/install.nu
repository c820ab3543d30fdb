# buildah: install Debian's buildah (1.28.2), write storage.conf (shared with podman) and
# the isolation setting; converged when a scratch image builds.

use ../lib/ctx.nu *
use ../lib/pkg.nu *
use ../lib/files.nu *
use ../lib/caps.nu *
use ../lib/containers.nu *

const PROFILE = "/etc/profile.d/provisioning-buildah.sh"

def main [] {
    let ctx = ($in | read-context)
    let version = $ctx.taskserv.version
    if $version != "1.28.2" { fail $"buildah ($version) is not installable here: Debian bookworm ships 1.28.2" }
    require-sys-admin buildah

    log "installing buildah"
    apt-install buildah
    let package_version = (upstream-version (installed-version buildah))
    if $package_version != $version { fail $"buildah ($package_version) is installed, ($version) was requested" }

    let driver = (storage-driver $ctx.config.storageDriver)
    let storage_changed = (write-if-changed $STORAGE_CONF (storage-conf $driver) --mode "0644")
    let profile_changed = (write-template $ctx "buildah.env" $PROFILE --mode "0644")
    record-config buildah [$STORAGE_CONF $PROFILE]
    log (if ($storage_changed or $profile_changed) { $"configuration written \(storage driver ($driver)\)" } else { "configuration unchanged" })
    let r = (^buildah version --json | complete)
    if $r.exit_code != 0 { fail $"buildah does not run: ($r.stderr | str trim)" }
    emit-result {
        version: $version
        packageVersion: (installed-version buildah)
        storageDriver: $driver
        binaryVersion: ($r.stdout | from json | get version)
    }
}
