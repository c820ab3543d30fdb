# Helpers shared by prometheus's scripts.

use ../lib/ctx.nu [address-of]

export const CONFIG = "/etc/prometheus/prometheus.yml"
export const RULES = "/etc/prometheus/rules.yml"
export const WEB = "/etc/prometheus/web.yml"
export const DEFAULTS = "/etc/default/prometheus"

# The base URL of the web UI/API (the address prometheus binds).
export def base-url [ctx: record]: nothing -> string {
    let host = if $ctx.config.bind != "" { $ctx.config.bind } else { address-of $ctx.server }
    let host = if ($host | str contains ":") { $"[($host)]" } else { $host }
    $"http://($host):($ctx.config.port)"
}
