# containerd: install Debian's containerd (1.6.20) and runc, write config.toml, start it.

use ../lib/ctx.nu *
use ../lib/pkg.nu *
use ../lib/files.nu *
use ../lib/service.nu *
use ../lib/net.nu *
use common.nu *

def main [] {
    let ctx = ($in | read-context)
    let version = $ctx.taskserv.version
    if $version != "1.6.20" { fail $"containerd ($version) is not installable here: Debian bookworm ships 1.6.20" }

    log "installing containerd and runc"
    apt-install containerd runc
    let package_version = (upstream-version (installed-version containerd))
    if $package_version != $version { fail $"containerd ($package_version) is installed, ($version) was requested" }

    let systemd = (has-systemd)
    let snapshotter = match $ctx.config.snapshotter {
        "auto" => (if (overlay-works) { "overlayfs" } else { "native" })
        $s => $s
    }
    # Built as data and serialised, so no config value is ever parsed as TOML syntax.
    let config = {
        version: 2
        root: "/var/lib/containerd"
        state: "/run/containerd"
        grpc: {address: $SOCKET}
        plugins: {
            "io.containerd.grpc.v1.cri": {
                sandbox_image: $ctx.config.sandboxImage
                containerd: {
                    snapshotter: $snapshotter
                    runtimes: {runc: {
                        runtime_type: "io.containerd.runc.v2"
                        options: {SystemdCgroup: $systemd}
                    }}
                }
            }
        }
    }
    let changed = (write-if-changed $CONFIG ($config | to toml) --mode "0644")
    log $"snapshotter ($snapshotter), systemd cgroups ($systemd)"
    svc-start containerd [/usr/bin/containerd --config $CONFIG] --unit containerd --restart=$changed
    wait-until "containerd to answer on its socket" { (server-version) != null } --timeout 60sec

    emit-result {
        version: $version
        packageVersion: (installed-version containerd)
        serverVersion: (server-version)
        snapshotter: $snapshotter
        endpoints: [$"unix://($SOCKET)"]
    }
}
