# webhook health: the health hook runs when called with the secret and is refused without
# it, and the hooks/flags files are what install wrote (else config drift, exit 3).

use ../lib/ctx.nu *
use ../lib/service.nu *
use ../lib/net.nu *
use ../lib/check.nu *
use common.nu *

def main [] {
    let ctx = ($in | read-context)
    if not (svc-running webhook --unit webhook) { fail "webhook is not running" --code 2 }
    let url = (hook-url $ctx "provisioning-health")
    let with_secret = (http-request $url --method POST --header $"X-Webhook-Secret: ($ctx.config.secret)")
    if $with_secret.status != 200 or ($with_secret.body | str trim) != "healthy" {
        fail $"POST ($url) with the secret answered ($with_secret.status) ($with_secret.body | str trim) ($with_secret.error)" --code 2
    }
    let without = (http-request $url --method POST)
    if $without.status != 403 { fail $"POST ($url) without the secret answered ($without.status), expected 403: the secret is not enforced" --code 2 }
    finish-check webhook {version: $ctx.taskserv.version}
}
