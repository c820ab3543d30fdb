# Helpers for services installed into a Kubernetes cluster (cilium, coredns, rook-ceph): they
# act once, through the API, from the first control-plane server; other servers do nothing.

use ctx.nu [members require-command]

export const ADMIN_CONF = "/etc/kubernetes/admin.conf"

# Whether this server is the first (by name) of the control-plane pool — or of the TaskServ's
# servers when there is no Cluster.
export def is-api-runner [ctx: record, pool: string]: nothing -> bool {
    let servers = ($ctx | get -o cluster.servers | default [])
    let candidates = if ($servers | is-not-empty) and ($pool != "") {
        $servers | where {|s| ($s | get -o pool | default "") == $pool }
    } else {
        members $ctx
    }
    ($candidates | is-not-empty) and (($candidates | sort-by name | first | get name) == $ctx.server.name)
}

# kubectl with the admin kubeconfig; returns the `complete` record.
export def --wrapped kube [...args: string]: nothing -> record {
    require-command kubectl "kubernetes is not installed on this server"
    ^kubectl --kubeconfig $ADMIN_CONF ...$args | complete
}

# kubectl apply of a manifest given as text (stdin, never a command line).
export def kube-apply [manifest: string] {
    require-command kubectl "kubernetes is not installed on this server"
    let r = ($manifest | ^kubectl --kubeconfig $ADMIN_CONF apply --server-side --force-conflicts -f - | complete)
    print -n $r.stdout
    if $r.exit_code != 0 { error make {msg: $"kubectl apply failed: ($r.stderr)"} }
}

# Downloads a URL to a file (with retries) and checks its SHA-256 against `sha256`, failing
# loudly: scripts run as root, so nothing downloaded is used unverified. A mismatch deletes
# the file. An empty `sha256` (no pin known for this version) refuses before downloading.
export def fetch [url: string, dest: string, --sha256: string = ""] {
    let want = ($sha256 | str trim | str downcase)
    if not ($want =~ '^[0-9a-f]{64}$') {
        error make {msg: $"no pinned sha256 for ($url): refusing to download it as root; set the checksum in the service's config \(see its taskserv.yaml\)"}
    }
    ^curl -fsSL --retry 5 --retry-delay 2 -o $dest $url
    let got = (open --raw $dest | hash sha256)
    if $got != $want {
        rm -f $dest
        error make {msg: $"sha256 mismatch for ($url): got ($got), pinned ($want); the file was deleted"}
    }
}
