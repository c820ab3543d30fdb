# prometheus health: /-/healthy answers 200 with the credentials and 401 without, the
# scrape targets are reported (how many are up), no alertmanager refuses its credentials,
# and the config files are what install wrote (else config drift, exit 3).

use ../lib/ctx.nu *
use ../lib/service.nu *
use ../lib/net.nu *
use ../lib/check.nu *
use common.nu *

def main [] {
    let ctx = ($in | read-context)
    if not (svc-running prometheus --unit prometheus) { fail "prometheus is not running" --code 2 }
    let base = (base-url $ctx)
    let user = $ctx.config.webUsername
    let password = $ctx.config.webPassword
    let healthy = (http-request $"($base)/-/healthy" --user $user --password $password)
    if $healthy.status != 200 { fail $"GET ($base)/-/healthy answered ($healthy.status) ($healthy.error)" --code 2 }
    let anonymous = (http-request $"($base)/-/healthy")
    if $anonymous.status != 401 { fail $"GET ($base)/-/healthy without credentials answered ($anonymous.status), expected 401: authentication is off" --code 2 }
    let targets = (http-request $"($base)/api/v1/targets?state=active" --user $user --password $password)
    let active = (try { $targets.body | from json | get data.activeTargets } catch { [] })
    # Alerts are sent with alertmanagerPassword: a password alertmanager refuses (e.g. one
    # generated here instead of shared through configFrom) would drop every alert silently.
    let config = ($ctx.templates | get "prometheus.yml" | from yaml)
    let alertmanagers = ($config | get -o alerting.alertmanagers | default [] | get static_configs | flatten | get targets | flatten)
    let refused = ($alertmanagers | where {|t|
        (http-request $"http://($t)/-/healthy" --user $ctx.config.alertmanagerUsername --password $ctx.config.alertmanagerPassword).status == 401
    })
    if ($refused | is-not-empty) {
        fail $"alertmanager ($refused | str join ', ') refuses prometheus's credentials: set config.alertmanagerPassword to the alertmanager's webPassword \(configFrom its Secret\)" --code 2
    }
    finish-check prometheus {
        version: $ctx.taskserv.version
        targets: ($active | length)
        targetsUp: ($active | where health == "up" | length)
    }
}
