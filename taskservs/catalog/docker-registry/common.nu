# Helpers shared by docker-registry's scripts.

use ../lib/ctx.nu [address-of]

export const CONFIG = "/etc/docker/registry/config.yml"
export const HTPASSWD = "/etc/docker/registry/htpasswd"

# The base URL of the registry API (the address it binds).
export def api-url [ctx: record]: nothing -> string {
    let host = if $ctx.config.bind != "" { $ctx.config.bind } else { address-of $ctx.server }
    let host = if ($host | str contains ":") { $"[($host)]" } else { $host }
    $"http://($host):($ctx.config.port)/v2/"
}
