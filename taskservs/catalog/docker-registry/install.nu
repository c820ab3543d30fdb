# docker-registry: install Debian's docker-registry (2.8.2), write config.yml and the bcrypt
# htpasswd file, (re)start when either changed; converged when /v2/ answers 200 with the
# credentials (and 401 without).

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
    if $version != "2.8.2" { fail $"docker-registry ($version) is not installable here: Debian bookworm ships 2.8.2" }
    if ($ctx.config.password? | default "" | is-empty) { fail "docker-registry requires config.password (the controller generates one into the TaskServ's Secret when it is unset)" }

    log "installing docker-registry"
    apt-install docker-registry apache2-utils
    let package_version = (upstream-version (installed-version docker-registry))
    if $package_version != $version { fail $"docker-registry ($package_version) is installed, ($version) was requested" }

    let user = $ctx.config.username
    let hash = (bcrypt-hash $user $ctx.config.password (htpasswd-hash-of $HTPASSWD $user))
    let auth_changed = (write-if-changed $HTPASSWD $"($user):($hash)\n" --mode "0640")
    let config_changed = (write-template $ctx "config.yml" $CONFIG --mode "0640")
    ^chown root:docker-registry $HTPASSWD $CONFIG
    record-config docker-registry [$CONFIG $HTPASSWD]
    let changed = $config_changed or $auth_changed
    log (if $changed { "configuration changed: (re)starting the registry" } else { "configuration unchanged" })
    svc-start docker-registry [/usr/bin/docker-registry serve $CONFIG] --user docker-registry --unit docker-registry --restart=$changed
    let url = (api-url $ctx)
    wait-until $"the registry to answer ($url)" { (http-request $url --user $user --password $ctx.config.password).status == 200 } --timeout 30sec

    emit-result {
        version: $version
        packageVersion: (installed-version docker-registry)
        endpoints: [($url | str replace -r '/v2/$' '')]
    }
}
