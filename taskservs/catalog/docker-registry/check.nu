# docker-registry health: /v2/ answers 200 with the credentials and 401 without (auth is
# on), and config.yml and htpasswd are what install wrote (else config drift, exit 3).

use ../lib/ctx.nu *
use ../lib/service.nu *
use ../lib/net.nu *
use ../lib/check.nu *
use common.nu *

def main [] {
    let ctx = ($in | read-context)
    if not (svc-running docker-registry --unit docker-registry) { fail "docker-registry is not running" --code 2 }
    let url = (api-url $ctx)
    let authed = (http-request $url --user $ctx.config.username --password $ctx.config.password)
    if $authed.status != 200 { fail $"GET ($url) with credentials answered ($authed.status) ($authed.error)" --code 2 }
    let anonymous = (http-request $url)
    if $anonymous.status != 401 { fail $"GET ($url) without credentials answered ($anonymous.status), expected 401: authentication is off" --code 2 }
    finish-check docker-registry {version: $ctx.taskserv.version}
}
