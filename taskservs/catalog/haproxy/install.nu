# haproxy: install Debian's haproxy (2.6), write /etc/haproxy/haproxy.cfg, validate it, and
# (re)start the daemon when it changed.

use ../lib/ctx.nu *
use ../lib/pkg.nu *
use ../lib/files.nu *
use ../lib/service.nu *
use ../lib/net.nu *

const CONFIG = "/etc/haproxy/haproxy.cfg"

def main [] {
    let ctx = ($in | read-context)
    let version = $ctx.taskserv.version
    if $version != "2.6" { fail $"haproxy ($version) is not installable here: Debian bookworm ships 2.6" }

    log "installing haproxy"
    apt-install haproxy
    let package_version = (upstream-version (installed-version haproxy))
    if not ($package_version starts-with $"($version).") { fail $"haproxy ($package_version) is installed, ($version) was requested" }

    let rendered = ($ctx.templates | get "haproxy.cfg")
    # Validate before replacing the live file, so a bad config never takes the proxy down.
    let candidate = "/etc/haproxy/haproxy.cfg.new"
    $rendered | save --force --raw $candidate
    let r = (^haproxy -c -f $candidate | complete)
    if $r.exit_code != 0 { rm -f $candidate; fail $"rendered haproxy.cfg is invalid:\n($r.stdout)($r.stderr)" }
    rm -f $candidate
    let changed = (write-if-changed $CONFIG $rendered --mode "0644")
    record-config haproxy [$CONFIG]
    log (if $changed { "configuration changed: (re)starting haproxy" } else { "configuration unchanged" })
    svc-start haproxy [/usr/sbin/haproxy -db -f $CONFIG] --unit haproxy --restart=$changed
    wait-port 127.0.0.1 $ctx.config.frontendPort --timeout 30sec

    let backends = ($rendered | lines | where {|l| ($l | str trim) starts-with "server " } | each {|l| let f = ($l | str trim | split row " "); {name: ($f | get 1), address: ($f | get 2)} })
    emit-result {
        version: $version
        packageVersion: (installed-version haproxy)
        backends: $backends
        endpoints: [$"(address-of $ctx.server):($ctx.config.frontendPort)"]
    }
}
