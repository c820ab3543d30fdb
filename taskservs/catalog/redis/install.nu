# redis: install Debian's redis-server (7.0.15), write /etc/redis/redis.conf, (re)start.

use ../lib/ctx.nu *
use ../lib/pkg.nu *
use ../lib/files.nu *
use ../lib/service.nu *
use ../lib/net.nu *
use common.nu *

const CONFIG = "/etc/redis/redis.conf"

def main [] {
    let ctx = ($in | read-context)
    let version = $ctx.taskserv.version
    if $version not-in ["7.0.15" "7.0"] { fail $"redis ($version) is not installable here: Debian bookworm ships 7.0.15" }

    # Secure by default: no password, no redis (the controller generates one when unset).
    if ($ctx.config.password? | default "" | is-empty) { fail "redis requires config.password (the controller generates one into the TaskServ's Secret when it is unset)" }
    log "installing redis-server"
    apt-install redis-server
    let package_version = (upstream-version (installed-version redis-server))
    if not ($package_version starts-with $version) { fail $"redis-server ($package_version) is installed, ($version) was requested" }

    let changed = (write-template $ctx "redis.conf" $CONFIG --mode "0640")
    ^chown redis:redis $CONFIG
    record-config redis [$CONFIG]
    log (if $changed { "configuration changed: (re)starting redis" } else { "configuration unchanged" })
    svc-start redis [/usr/bin/redis-server $CONFIG] --user redis --unit redis-server --restart=$changed
    wait-port 127.0.0.1 $ctx.config.port --timeout 30sec
    wait-until "redis to answer PING" { (redis-cli $ctx PING | get stdout | str trim) == "PONG" } --timeout 30sec

    emit-result {
        version: $version
        packageVersion: (installed-version redis-server)
        endpoints: [$"redis://(address-of $ctx.server):($ctx.config.port)"]
    }
}
