# Helpers shared by alertmanager's scripts.

use ../lib/ctx.nu [address-of]

export const CONFIG = "/etc/prometheus/alertmanager.yml"
export const WEB = "/etc/prometheus/alertmanager-web.yml"
export const DEFAULTS = "/etc/default/prometheus-alertmanager"

# The base URL of the web UI/API (the address alertmanager binds).
export def base-url [ctx: record]: nothing -> string {
    let host = if $ctx.config.bind != "" { $ctx.config.bind } else { address-of $ctx.server }
    let host = if ($host | str contains ":") { $"[($host)]" } else { $host }
    $"http://($host):($ctx.config.port)"
}
