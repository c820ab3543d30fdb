# Helpers shared by webhook's scripts.

use ../lib/ctx.nu [address-of]

export const HOOKS = "/etc/webhook.conf"
export const DEFAULTS = "/etc/default/webhook"
export const DROPIN = "/etc/systemd/system/webhook.service.d/provisioning.conf"

# The URL of hook `id` (the address the server binds).
export def hook-url [ctx: record, id: string]: nothing -> string {
    let host = if $ctx.config.bind != "" { $ctx.config.bind } else { address-of $ctx.server }
    let host = if ($host | str contains ":") { $"[($host)]" } else { $host }
    $"http://($host):($ctx.config.port)/hooks/($id)"
}
