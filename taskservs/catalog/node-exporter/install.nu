# node-exporter: install Debian's prometheus-node-exporter (1.5.0), write its flags,
# (re)start when they changed; converged when /metrics answers.

use ../lib/ctx.nu *
use ../lib/pkg.nu *
use ../lib/files.nu *
use ../lib/service.nu *
use ../lib/net.nu *
use common.nu *

def main [] {
    let ctx = ($in | read-context)
    let version = $ctx.taskserv.version
    if $version != "1.5.0" { fail $"node-exporter ($version) is not installable here: Debian bookworm ships 1.5.0" }

    log "installing prometheus-node-exporter"
    apt-install prometheus-node-exporter
    let package_version = (upstream-version (installed-version prometheus-node-exporter))
    if $package_version != $version { fail $"prometheus-node-exporter ($package_version) is installed, ($version) was requested" }

    let changed = (write-template $ctx "prometheus-node-exporter.default" $DEFAULTS --mode "0644")
    record-config node-exporter [$DEFAULTS]
    log (if $changed { "configuration changed: (re)starting node-exporter" } else { "configuration unchanged" })
    svc-start node-exporter ([/usr/bin/prometheus-node-exporter] | append (default-args $DEFAULTS)) --user prometheus --unit prometheus-node-exporter --restart=$changed
    let url = (metrics-url $ctx)
    wait-until $"node-exporter to answer ($url)" { (http-request $url).status == 200 } --timeout 30sec

    emit-result {
        version: $version
        packageVersion: (installed-version prometheus-node-exporter)
        endpoints: [$url]
    }
}
