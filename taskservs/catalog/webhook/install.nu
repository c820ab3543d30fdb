# webhook: install Debian's webhook (2.8.0), write the hooks (each requiring the secret) and
# the daemon's flags, (re)start when they changed; converged when the health hook answers.

use ../lib/ctx.nu *
use ../lib/pkg.nu *
use ../lib/files.nu *
use ../lib/service.nu *
use ../lib/net.nu *
use common.nu *

def main [] {
    let ctx = ($in | read-context)
    let version = $ctx.taskserv.version
    if $version != "2.8.0" { fail $"webhook ($version) is not installable here: Debian bookworm ships 2.8.0" }
    if ($ctx.config.secret? | default "" | is-empty) { fail "webhook requires config.secret (the controller generates one into the TaskServ's Secret when it is unset)" }

    log "installing webhook"
    apt-install webhook
    let package_version = (upstream-version (installed-version webhook))
    if $package_version != $version { fail $"webhook ($package_version) is installed, ($version) was requested" }

    # The hooks hold the secret: readable by root only (webhook runs as root to run commands).
    let hooks_changed = (write-template $ctx "hooks.json" $HOOKS --mode "0600")
    let args_changed = (write-template $ctx "webhook.default" $DEFAULTS --mode "0644")
    let dropin_changed = (write-template $ctx "webhook.service.conf" $DROPIN --mode "0644")
    record-config webhook [$HOOKS $DEFAULTS $DROPIN]
    let changed = $hooks_changed or $args_changed or $dropin_changed
    log (if $changed { "configuration changed: (re)starting webhook" } else { "configuration unchanged" })
    svc-start webhook ([/usr/bin/webhook] | append (default-args $DEFAULTS)) --unit webhook --restart=$changed
    let url = (hook-url $ctx "provisioning-health")
    wait-until $"webhook to answer ($url)" { (http-request $url --method POST --header $"X-Webhook-Secret: ($ctx.config.secret)").status == 200 } --timeout 30sec

    emit-result {
        version: $version
        packageVersion: (installed-version webhook)
        hooks: (["provisioning-health"] | append ($ctx.config.hooks | get id))
        endpoints: [($url | str replace -r '/provisioning-health$' '/')]
    }
}
