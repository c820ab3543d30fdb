# podman health: the API service answers /_ping and reports the requested version,
# `podman info` works with the configured storage driver, and the config files are what
# install wrote (else config drift, exit 3).

use ../lib/ctx.nu *
use ../lib/net.nu *
use ../lib/check.nu *
use common.nu *

def main [] {
    let ctx = ($in | read-context)
    let ping = (http-request "http://d/_ping" --unix-socket $SOCKET)
    if $ping.body != "OK" { fail $"the podman API on ($SOCKET) does not answer /_ping: ($ping.status) ($ping.error)" --code 2 }
    let api = (http-request "http://d/v4.0.0/libpod/version" --unix-socket $SOCKET)
    let server = (try { $api.body | from json | get Version } catch { "" })
    if not ($server starts-with $ctx.taskserv.version) { fail $"the podman API reports version '($server)', ($ctx.taskserv.version) was requested" --code 2 }
    let info = (^podman info --format json | complete)
    let driver = (try { $info.stdout | from json | get store.graphDriverName } catch { "" })
    if $info.exit_code != 0 or $driver == "" { fail $"podman info failed: ($info.stderr | str trim)" --code 2 }
    finish-check podman {version: $ctx.taskserv.version, serverVersion: $server, storageDriver: $driver}
}
