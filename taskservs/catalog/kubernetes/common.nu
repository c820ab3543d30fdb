# Helpers shared by kubernetes's scripts.

use ../lib/ctx.nu [address-of members require-command]

export const ADMIN_CONF = "/etc/kubernetes/admin.conf"

# The control-plane servers, sorted by name: the Cluster's servers of the control-plane pool,
# or (standalone TaskServ) this server and its peers.
export def control-planes [ctx: record]: nothing -> list<record> {
    let pool = $ctx.config.controlPlanePool
    let servers = ($ctx | get -o cluster.servers | default [])
    if ($servers | is-not-empty) and ($pool != "") {
        $servers | where {|s| ($s | get -o pool | default "") == $pool } | sort-by name
    } else {
        members $ctx
    }
}

# This server's role: "init" (first control plane), "control-plane" or "worker".
export def role [ctx: record]: nothing -> string {
    let cps = (control-planes $ctx)
    if ($cps | is-empty) { error make {msg: "no control-plane servers"} }
    if ($cps | first | get name) == $ctx.server.name {
        "init"
    } else if ($ctx.server.name in ($cps | get name)) {
        "control-plane"
    } else {
        "worker"
    }
}

# host:port of the API server.
export def api-endpoint [ctx: record]: nothing -> string {
    if $ctx.config.controlPlaneEndpoint != "" {
        $ctx.config.controlPlaneEndpoint
    } else {
        $"(address-of (control-planes $ctx | first)):6443"
    }
}

# "1.31.4" -> "v1.31".
export def minor-of [version: string]: nothing -> string {
    let parts = ($version | split row ".")
    $"v($parts.0).($parts.1)"
}

export def --wrapped kubectl [...args: string]: nothing -> record {
    require-command kubectl "kubernetes is not installed on this server"
    ^kubectl --kubeconfig $ADMIN_CONF ...$args | complete
}
