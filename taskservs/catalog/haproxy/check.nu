# haproxy health: the daemon runs and the frontend (and stats page, when enabled) listens.

use ../lib/ctx.nu *
use ../lib/service.nu *
use ../lib/net.nu *

def main [] {
    let ctx = ($in | read-context)
    if not (svc-running haproxy --unit haproxy) { fail "haproxy is not running" }
    if not (port-open 127.0.0.1 $ctx.config.frontendPort) { fail $"frontend port ($ctx.config.frontendPort) is closed" --code 2 }
    if $ctx.config.statsPort != 0 and not (port-open 127.0.0.1 $ctx.config.statsPort) { fail "stats port is closed" --code 2 }
    emit-result {healthy: true, version: $ctx.taskserv.version}
}
