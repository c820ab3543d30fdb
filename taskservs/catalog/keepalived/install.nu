# keepalived: install Debian's keepalived (2.2.7), write keepalived.conf (validated with
# keepalived -t), (re)start when it changed; converged when the daemon reports a VRRP state.

use ../lib/ctx.nu *
use ../lib/pkg.nu *
use ../lib/files.nu *
use ../lib/service.nu *
use ../lib/net.nu *
use common.nu *

def main [] {
    let ctx = ($in | read-context)
    let version = $ctx.taskserv.version
    if $version != "2.2.7" { fail $"keepalived ($version) is not installable here: Debian bookworm ships 2.2.7" }
    if ($ctx.config.authPassword? | default "" | is-empty) { fail "keepalived requires config.authPassword (the controller generates one into the TaskServ's Secret when it is unset)" }

    log "installing keepalived"
    apt-install keepalived
    let package_version = (upstream-version (installed-version keepalived))
    if $package_version != $version { fail $"keepalived ($package_version) is installed, ($version) was requested" }

    let interface = if $ctx.config.interface != "" { $ctx.config.interface } else { interface-of (address-of $ctx.server) }
    if $interface == "" { fail $"no interface carries the private address (address-of $ctx.server); set config.interface" }
    # The interface is known only on the machine: the template leaves a marker for it.
    let rendered = ($ctx.templates | get "keepalived.conf" | str replace "PROVISIONING_INTERFACE" $interface)
    let candidate = (^mktemp | str trim)
    $rendered | save --force --raw $candidate
    let r = (^keepalived -t -f $candidate | complete)
    rm -f $candidate
    if $r.exit_code != 0 { fail $"rendered keepalived.conf is invalid:\n($r.stdout)($r.stderr)" }
    let changed = (write-if-changed $CONFIG $rendered --mode "0600")
    record-config keepalived [$CONFIG]
    log (if $changed { "configuration changed: (re)starting keepalived" } else { "configuration unchanged" })
    svc-start keepalived [/usr/sbin/keepalived --dont-fork --log-console -f $CONFIG -p $PID] --unit keepalived --restart=$changed
    wait-until "keepalived to report its VRRP state" { (vrrp-state) in [MASTER BACKUP] } --timeout 30sec

    if not (has-net-admin) {
        log "no CAP_NET_ADMIN here: keepalived runs VRRP but cannot add the floating address"
    }
    emit-result {
        version: $version
        packageVersion: (installed-version keepalived)
        state: (vrrp-state)
        interface: $interface
        virtualAddress: $ctx.config.virtualAddress
        vipCapable: (has-net-admin)
    }
}
