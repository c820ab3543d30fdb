# nginx: install exactly the requested Debian version of nginx (upgrade or downgrade), write
# /etc/nginx/nginx.conf after validating it, and (re)start when the config or the binary
# changed. Converged when /healthz answers.

use ../lib/ctx.nu *
use ../lib/pkg.nu *
use ../lib/files.nu *
use ../lib/service.nu *
use ../lib/net.nu *

const CONFIG = "/etc/nginx/nginx.conf"

def main [] {
    let ctx = ($in | read-context)
    let version = $ctx.taskserv.version
    let before = (installed-version nginx)
    log $"installing nginx ($version) \(installed: ($before | default 'none')\)"
    apt-install-exact $version nginx nginx-common
    let package_changed = ((installed-version nginx) != $before)

    let rendered = ($ctx.templates | get "nginx.conf")
    # Validated before it replaces the live file: a bad config never takes the proxy down.
    let candidate = "/etc/nginx/nginx.conf.new"
    $rendered | save --force --raw $candidate
    let r = (^nginx -t -q -c $candidate | complete)
    rm -f $candidate
    if $r.exit_code != 0 { fail $"rendered nginx.conf is invalid:\n($r.stdout)($r.stderr)" }
    let changed = (write-if-changed $CONFIG $rendered --mode "0644")
    record-config nginx [$CONFIG]
    let restart = $changed or $package_changed
    log (if $restart { "configuration or package changed: (re)starting nginx" } else { "configuration unchanged" })
    svc-start nginx [/usr/sbin/nginx -c $CONFIG -g "daemon off;"] --unit nginx --restart=$restart
    let port = $ctx.config.listenPort
    # nginx retries a busy port for a few seconds, then exits: fail as soon as it is gone.
    let deadline = ((date now) + 30sec)
    while not (health $port) {
        if not (svc-running nginx --unit nginx) {
            let tail = (try { open --raw /var/log/nginx/error.log | decode utf-8 | lines | last 5 | str join "\n" } catch { "" })
            fail $"nginx exited after its start:\n($tail)"
        }
        if (date now) > $deadline { fail $"nginx does not answer /healthz on 127.0.0.1:($port) within 30s" }
        sleep 250ms
    }

    emit-result {
        version: $version
        packageVersion: (installed-version nginx)
        upstreams: ($rendered | lines | parse -r '^\s*server\s+(?<target>[^\s{]+);$' | get target)
        endpoints: [$"http://(address-of $ctx.server):($port)"]
    }
}

def health [port: int]: nothing -> bool {
    let r = (^curl -fsS --max-time 3 $"http://127.0.0.1:($port)/healthz" | complete)
    $r.exit_code == 0 and ($r.stdout | str trim) == "ok"
}
