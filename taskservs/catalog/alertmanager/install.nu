# alertmanager: install Debian's prometheus-alertmanager (0.25.0), write alertmanager.yml
# (checked with amtool), the basic-auth web config and the flags; (re)start when anything
# changed; converged when /-/ready answers with the credentials.

use ../lib/ctx.nu *
use ../lib/pkg.nu *
use ../lib/files.nu *
use ../lib/service.nu *
use ../lib/net.nu *
use ../lib/auth.nu *
use common.nu *

def main [] {
    let ctx = ($in | read-context)
    let version = $ctx.taskserv.version
    if $version != "0.25.0" { fail $"alertmanager ($version) is not installable here: Debian bookworm ships 0.25.0" }
    if ($ctx.config.webPassword? | default "" | is-empty) { fail "alertmanager requires config.webPassword (the controller generates one into the TaskServ's Secret when it is unset)" }

    log "installing prometheus-alertmanager"
    apt-install prometheus-alertmanager apache2-utils
    let package_version = (upstream-version (installed-version prometheus-alertmanager))
    if $package_version != $version { fail $"prometheus-alertmanager ($package_version) is installed, ($version) was requested" }

    let candidate = (^mktemp --suffix .yml | str trim)
    ($ctx.templates | get "alertmanager.yml") | save --force --raw $candidate
    let r = (^amtool check-config $candidate | complete)
    rm -f $candidate
    if $r.exit_code != 0 { fail $"rendered alertmanager.yml is invalid:\n($r.stdout)($r.stderr)" }

    let config_changed = (write-template $ctx "alertmanager.yml" $CONFIG --mode "0644")
    let flags_changed = (write-template $ctx "prometheus-alertmanager.default" $DEFAULTS --mode "0644")
    let web_changed = (write-web-config $WEB $ctx.config.webUsername $ctx.config.webPassword --group prometheus)
    record-config alertmanager [$CONFIG $DEFAULTS $WEB]
    mkdir /var/lib/prometheus/alertmanager
    ^chown prometheus:prometheus /var/lib/prometheus/alertmanager
    let changed = $config_changed or $flags_changed or $web_changed
    log (if $changed { "configuration changed: (re)starting alertmanager" } else { "configuration unchanged" })
    svc-start alertmanager ([/usr/bin/prometheus-alertmanager] | append (default-args $DEFAULTS)) --user prometheus --unit prometheus-alertmanager --restart=$changed
    let url = $"(base-url $ctx)/-/ready"
    wait-until $"alertmanager to answer ($url)" { (http-request $url --user $ctx.config.webUsername --password $ctx.config.webPassword).status == 200 } --timeout 60sec

    emit-result {
        version: $version
        packageVersion: (installed-version prometheus-alertmanager)
        endpoints: [(base-url $ctx)]
    }
}
