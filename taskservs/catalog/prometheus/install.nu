# prometheus: install Debian's prometheus (2.42.0), write prometheus.yml (node-exporters of
# the Cluster, alertmanagers), the alert rules, the basic-auth web config and the flags;
# validate with promtool; (re)start when anything changed; converged when /-/ready answers.

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
    if $version != "2.42.0" { fail $"prometheus ($version) is not installable here: Debian bookworm ships 2.42.0" }
    if ($ctx.config.webPassword? | default "" | is-empty) { fail "prometheus requires config.webPassword (the controller generates one into the TaskServ's Secret when it is unset)" }

    log "installing prometheus"
    apt-install prometheus apache2-utils
    let package_version = (upstream-version (installed-version prometheus))
    if $package_version != $version { fail $"prometheus ($package_version) is installed, ($version) was requested" }

    # Validated before the live files are replaced: a bad config never takes prometheus down.
    let dir = (^mktemp -d | str trim)
    ($ctx.templates | get "prometheus.yml") | str replace $RULES $"($dir)/rules.yml" | save --force --raw $"($dir)/prometheus.yml"
    ($ctx.templates | get "rules.yml") | save --force --raw $"($dir)/rules.yml"
    let r = (^promtool check config $"($dir)/prometheus.yml" | complete)
    rm -rf $dir
    if $r.exit_code != 0 { fail $"rendered prometheus.yml is invalid:\n($r.stdout)($r.stderr)" }

    # prometheus.yml may hold the alertmanager password: readable by root and prometheus only.
    let config_changed = (write-template $ctx "prometheus.yml" $CONFIG --mode "0640")
    let rules_changed = (write-template $ctx "rules.yml" $RULES --mode "0644")
    let flags_changed = (write-template $ctx "prometheus.default" $DEFAULTS --mode "0644")
    let web_changed = (write-web-config $WEB $ctx.config.webUsername $ctx.config.webPassword --group prometheus)
    ^chown root:prometheus $CONFIG
    record-config prometheus [$CONFIG $RULES $DEFAULTS $WEB]
    let changed = $config_changed or $rules_changed or $flags_changed or $web_changed
    log (if $changed { "configuration changed: (re)starting prometheus" } else { "configuration unchanged" })
    svc-start prometheus ([/usr/bin/prometheus] | append (default-args $DEFAULTS)) --user prometheus --unit prometheus --restart=$changed
    let url = $"(base-url $ctx)/-/ready"
    wait-until $"prometheus to answer ($url)" { (http-request $url --user $ctx.config.webUsername --password $ctx.config.webPassword).status == 200 } --timeout 60sec

    let config = ($ctx.templates | get "prometheus.yml" | from yaml)
    emit-result {
        version: $version
        packageVersion: (installed-version prometheus)
        scrapeTargets: ($config.scrape_configs | get static_configs | flatten | get targets | flatten)
        alertmanagers: ($config | get -o alerting.alertmanagers | default [] | get static_configs | flatten | get targets | flatten)
        endpoints: [(base-url $ctx)]
    }
}
