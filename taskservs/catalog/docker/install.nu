# docker: install Debian's docker.io (20.10.24), write daemon.json (unix socket only; storage
# driver and networking fitted to the machine), (re)start dockerd when it changed; converged
# when the daemon answers on its socket.

use ../lib/ctx.nu *
use ../lib/pkg.nu *
use ../lib/files.nu *
use ../lib/service.nu *
use ../lib/net.nu *
use ../lib/caps.nu *
use common.nu *

def main [] {
    let ctx = ($in | read-context)
    let version = $ctx.taskserv.version
    if $version != "20.10.24" { fail $"docker ($version) is not installable here: Debian bookworm ships 20.10.24" }

    log "installing docker.io"
    apt-install docker.io
    let package_version = (upstream-version (installed-version docker.io))
    if $package_version != $version { fail $"docker.io ($package_version) is installed, ($version) was requested" }

    let driver = match $ctx.config.storageDriver {
        "auto" => (if (overlay-mountable) { "overlay2" } else { "vfs" })
        $d => $d
    }
    let networking = match $ctx.config.networking {
        "auto" => (has-capability $CAP_NET_ADMIN)
        "on" => true
        _ => false
    }
    let rendered = ($ctx.templates | get "daemon.json"
        | str replace "PROVISIONING_STORAGE_DRIVER" $driver
        | str replace --all "PROVISIONING_NETWORKING" ($networking | into string)
        | str replace "PROVISIONING_BRIDGE" (if $networking { '""' } else { '"none"' }))
    # Parsed before it is written: dockerd refuses to start on invalid JSON.
    try { $rendered | from json | ignore } catch { fail "rendered daemon.json is not valid JSON" }
    let changed = (write-if-changed $CONFIG $rendered --mode "0644")
    record-config docker [$CONFIG]
    log $"storage driver ($driver), networking ($networking)"
    log (if $changed { "configuration changed: (re)starting dockerd" } else { "configuration unchanged" })
    svc-start docker [/usr/sbin/dockerd --config-file $CONFIG] --unit docker --restart=$changed
    wait-until "dockerd to answer on its socket" { (http-request "http://d/_ping" --unix-socket $SOCKET).body == "OK" } --timeout 90sec

    emit-result {
        version: $version
        packageVersion: (installed-version docker.io)
        storageDriver: $driver
        networking: $networking
        endpoints: [$"unix://($SOCKET)"]
    }
}
