# redis health: the daemon runs and answers PING, and redis.conf is what install wrote
# (else config drift, exit 3).

use ../lib/ctx.nu *
use ../lib/service.nu *
use ../lib/check.nu *
use common.nu *

def main [] {
    let ctx = ($in | read-context)
    if not (svc-running redis --unit redis-server) { fail "redis-server is not running" }
    let r = (redis-cli $ctx PING)
    if ($r.stdout | str trim) != "PONG" { fail $"PING answered ($r.stdout | str trim) ($r.stderr | str trim)" --code 2 }
    let info = (redis-cli $ctx INFO server | get stdout | lines | where {|l| $l starts-with "redis_version:" } | first | str replace "redis_version:" "" | str trim)
    finish-check redis {version: $ctx.taskserv.version, serverVersion: $info}
}
