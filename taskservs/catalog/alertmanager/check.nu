# alertmanager health: /-/healthy answers 200 with the credentials and 401 without, the
# status API reports the running version, and the config files are what install wrote
# (else config drift, exit 3).

use ../lib/ctx.nu *
use ../lib/service.nu *
use ../lib/net.nu *
use ../lib/check.nu *
use common.nu *

def main [] {
    let ctx = ($in | read-context)
    if not (svc-running alertmanager --unit prometheus-alertmanager) { fail "alertmanager is not running" --code 2 }
    let base = (base-url $ctx)
    let user = $ctx.config.webUsername
    let password = $ctx.config.webPassword
    let healthy = (http-request $"($base)/-/healthy" --user $user --password $password)
    if $healthy.status != 200 { fail $"GET ($base)/-/healthy answered ($healthy.status) ($healthy.error)" --code 2 }
    let anonymous = (http-request $"($base)/-/healthy")
    if $anonymous.status != 401 { fail $"GET ($base)/-/healthy without credentials answered ($anonymous.status), expected 401: authentication is off" --code 2 }
    let status = (http-request $"($base)/api/v2/status" --user $user --password $password)
    let running = (try { $status.body | from json | get versionInfo.version } catch { "" })
    finish-check alertmanager {version: $ctx.taskserv.version, serverVersion: $running}
}
