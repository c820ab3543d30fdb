# haproxy health: the daemon runs, the frontend (and stats page, when enabled) listens, and
# haproxy.cfg is what install wrote (else config drift, exit 3).

use ../lib/ctx.nu *
use ../lib/service.nu *
use ../lib/net.nu *
use ../lib/check.nu *

def main [] {
    let ctx = ($in | read-context)
    if not (svc-running haproxy --unit haproxy) { fail "haproxy is not running" }
    if not (port-open 127.0.0.1 $ctx.config.frontendPort) { fail $"frontend port ($ctx.config.frontendPort) is closed" --code 2 }
    if $ctx.config.statsPort != 0 and not (port-open 127.0.0.1 $ctx.config.statsPort) { fail "stats port is closed" --code 2 }
    finish-check haproxy {version: $ctx.taskserv.version}
}
