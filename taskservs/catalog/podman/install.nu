# podman: install Debian's podman (4.3.1), write storage.conf and the engine settings, run
# the API service on a root-only unix socket; converged when the API answers /_ping.

use ../lib/ctx.nu *
use ../lib/pkg.nu *
use ../lib/files.nu *
use ../lib/service.nu *
use ../lib/net.nu *
use ../lib/caps.nu *
use ../lib/containers.nu *
use common.nu *

def main [] {
    let ctx = ($in | read-context)
    let version = $ctx.taskserv.version
    if $version != "4.3.1" { fail $"podman ($version) is not installable here: Debian bookworm ships 4.3.1" }
    require-sys-admin podman

    log "installing podman"
    apt-install podman
    let package_version = (upstream-version (installed-version podman))
    if $package_version != $version { fail $"podman ($package_version) is installed, ($version) was requested" }

    let driver = (storage-driver $ctx.config.storageDriver)
    let cgroups = if (has-systemd) { "systemd" } else { "cgroupfs" }
    let engine = ($ctx.templates | get "40-provisioning-podman.conf" | str replace "PROVISIONING_CGROUP_MANAGER" $cgroups)
    let storage_changed = (write-if-changed $STORAGE_CONF (storage-conf $driver) --mode "0644")
    let engine_changed = (write-if-changed $ENGINE_CONF $engine --mode "0644")
    record-config podman [$STORAGE_CONF $ENGINE_CONF]
    let changed = $storage_changed or $engine_changed
    log $"storage driver ($driver), cgroup manager ($cgroups)"
    mkdir ($SOCKET | path dirname)
    ^chmod 0700 ($SOCKET | path dirname)
    svc-start podman [/usr/bin/podman system service --time=0 $"unix://($SOCKET)"] --unit podman.socket --restart=$changed
    wait-until "the podman API to answer /_ping" { (http-request "http://d/_ping" --unix-socket $SOCKET).body == "OK" } --timeout 60sec

    emit-result {
        version: $version
        packageVersion: (installed-version podman)
        storageDriver: $driver
        endpoints: [$"unix://($SOCKET)"]
    }
}
