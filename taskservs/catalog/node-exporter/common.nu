# Helpers shared by node-exporter's scripts.

use ../lib/ctx.nu [address-of]

export const DEFAULTS = "/etc/default/prometheus-node-exporter"

# The URL of /metrics (the address the exporter binds).
export def metrics-url [ctx: record]: nothing -> string {
    let host = if $ctx.config.bind != "" { $ctx.config.bind } else { address-of $ctx.server }
    let host = if ($host | str contains ":") { $"[($host)]" } else { $host }
    $"http://($host):($ctx.config.port)/metrics"
}
