# crun: install Debian's crun (1.8.1) and register it as the default OCI runtime of
# podman/buildah; converged when the binary answers.

use ../lib/ctx.nu *
use ../lib/pkg.nu *
use ../lib/files.nu *

const CONF = "/etc/containers/containers.conf.d/50-provisioning-crun.conf"

def main [] {
    let ctx = ($in | read-context)
    let version = $ctx.taskserv.version
    if $version != "1.8.1" { fail $"crun ($version) is not installable here: Debian bookworm ships 1.8.1" }
    log "installing crun"
    apt-install crun
    let package_version = (upstream-version (installed-version crun))
    if $package_version != $version { fail $"crun ($package_version) is installed, ($version) was requested" }
    let changed = (write-template $ctx "50-provisioning-crun.conf" $CONF --mode "0644")
    record-config crun [$CONF]
    log (if $changed { "runtime registration written" } else { "configuration unchanged" })
    let reported = (^crun --version | lines | first | str replace "crun version " "" | str trim)
    emit-result {version: $version, packageVersion: (installed-version crun), binaryVersion: $reported}
}
