# node-exporter health: /metrics answers with node_exporter_build_info, and the flags file
# is what install wrote (else config drift, exit 3).

use ../lib/ctx.nu *
use ../lib/service.nu *
use ../lib/net.nu *
use ../lib/check.nu *
use common.nu *

def main [] {
    let ctx = ($in | read-context)
    if not (svc-running node-exporter --unit prometheus-node-exporter) { fail "prometheus-node-exporter is not running" --code 2 }
    let url = (metrics-url $ctx)
    let r = (http-request $url)
    if $r.status != 200 or not ($r.body | str contains "node_exporter_build_info") { fail $"GET ($url) answered ($r.status) ($r.error)" --code 2 }
    let build = ($r.body | lines | where {|l| $l starts-with "node_exporter_build_info" } | get -o 0 | default "")
    let running = ($build | parse -r '[{,]version="(?<v>[^"]+)"' | get -o 0.v | default "")
    finish-check node-exporter {version: $ctx.taskserv.version, serverVersion: $running}
}
