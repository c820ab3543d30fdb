# Helpers shared by kubernetes's scripts.

use ../lib/ctx.nu [address-of members require-command log]

export const ADMIN_CONF = "/etc/kubernetes/admin.conf"

# The pkgs.k8s.io signing key (the Kubernetes project's "isv:kubernetes OBS Project" key, the
# same for every minor version's repository): a downloaded Release.key is trusted only when
# this is its one primary key. When upstream rotates it, update the pin after checking the
# new fingerprint against kubernetes.io.
# Source: the same fingerprint is pinned for https://pkgs.k8s.io/core:/stable:/v<minor>/deb/Release.key
# by puppetlabs/puppetlabs-kubernetes, manifests/packages.pp (`kubernetes_key_id` default,
# commit d37babaee1ccb6b023ef723ae4599852d5e3a065) — a third party's pin, not a file the
# Kubernetes project publishes: `gpg --show-keys Release.key` is the check that counts.
export const K8S_APT_KEY_FINGERPRINT = "DE15B14486CD377B9E876E1A234654DA9A296436"

# Fails unless the OpenPGP key file `file` holds exactly one primary key, `fingerprint`.
export def verify-key-fingerprint [file: path, fingerprint: string] {
    let out = (^gpg --batch --with-colons --show-keys $file | complete)
    if $out.exit_code != 0 {
        error make {msg: $"($file) is not an OpenPGP key: ($out.stderr | str trim)"}
    }
    let records = ($out.stdout | lines | each {|l| $l | split row ":" })
    # Each primary key's fingerprint is the `fpr` record right after its `pub` record.
    let primaries = ($records | window 2 | where {|w| ($w.0 | first) == "pub" and ($w.1 | first) == "fpr" } | each {|w| $w.1 | get 9 })
    if $primaries != [$fingerprint] {
        error make {msg: $"($file): key fingerprint ($primaries | str join ', ') is not the pinned ($fingerprint); refusing to trust it"}
    }
}

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
        host-port (address-of (control-planes $ctx | first)) 6443
    }
}

# `host:port`, an IPv6 address in brackets (as kubeadm and Go's net.SplitHostPort want it).
export def host-port [host: string, port: int]: nothing -> string {
    if ($host | str contains ":") { $"[($host)]:($port)" } else { $"($host):($port)" }
}

# {host, port} of a `host:port` endpoint (an IPv6 host in brackets, returned without them).
export def split-endpoint [endpoint: string]: nothing -> record<host: string, port: int> {
    let v6 = ($endpoint | parse --regex '^\[(?<host>[0-9A-Fa-f:.]+)\]:(?<port>[0-9]{1,5})$')
    let other = ($endpoint | parse --regex '^(?<host>[^:\[\]]+):(?<port>[0-9]{1,5})$')
    let m = ($v6 | append $other)
    if ($m | is-empty) { error make {msg: $"API endpoint ($endpoint) is not host:port"} }
    {host: ($m.0.host), port: ($m.0.port | into int)}
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

# Writes a file only root may read, never readable by others even for a moment (created
# empty with mode 0600 first, then filled: an overwrite keeps the mode). True when changed.
export def write-secret-file [path: string, content: string]: nothing -> bool {
    mkdir ($path | path dirname)
    if not ($path | path exists) { ^install -m 0600 /dev/null $path }
    ^chmod 0600 $path
    let current = (open --raw $path | decode utf-8)
    if $current == $content { return false }
    $content | save --force --raw $path
    true
}

# "sha256:<hex>" of the CA's public key (SubjectPublicKeyInfo, DER) from its private key, as
# `kubeadm join --discovery-token-ca-cert-hash` wants it. The key goes through stdin.
export def ca-cert-hash [ca_key: string]: nothing -> string {
    let der = ($ca_key | ^openssl pkey -pubout -outform DER)
    let hex = ($der | ^sha256sum | split row " " | first)
    if ($hex | str length) != 64 { error make {msg: "could not compute the CA public key hash (is caKey a private key?)"} }
    $"sha256:($hex)"
}

# The JoinConfiguration of this server (JSON is YAML): the token, the pinned CA hash and, for
# a control plane, the certificate key. Written to a 0600 file, never passed on a command line.
export def join-config [ctx: record, endpoint: string, ca_hash: string, control_plane: bool, advertise: string]: nothing -> string {
    let base = {
        apiVersion: "kubeadm.k8s.io/v1beta4"
        kind: JoinConfiguration
        discovery: {bootstrapToken: {apiServerEndpoint: $endpoint, token: $ctx.config.bootstrapToken, caCertHashes: [$ca_hash]}}
        nodeRegistration: {name: $ctx.server.name, criSocket: "unix:///run/containerd/containerd.sock"}
    }
    let config = if $control_plane {
        $base | insert controlPlane {certificateKey: $ctx.config.certificateKey, localAPIEndpoint: {advertiseAddress: $advertise, bindPort: 6443}}
    } else { $base }
    $config | to json
}

# The JoinConfiguration install.nu writes on a joining server: to the API endpoint, as a
# control plane when this server is one (kubeadm-config checks it against kubeadm's types).
export def join-config-for [ctx: record, ca_hash: string]: nothing -> string {
    join-config $ctx (api-endpoint $ctx) $ca_hash ((role $ctx) == "control-plane") (address-of $ctx.server)
}

# How long a bootstrap token lives: kubeadm init's, and each one renewed for a late joiner.
export const JOIN_TOKEN_TTL = "1h0m0s"

# The line that carries the admin kubeconfig to the controller: the runner withholds
# `PROVISIONING_SECRET` lines from every output (logs, status, events) and the controller
# writes the kubeconfig into the Secret `<cluster>-kubeconfig` only.
export def kubeconfig-secret-line [kubeconfig: string]: nothing -> string {
    $"PROVISIONING_SECRET ({kubeconfig: $kubeconfig} | to json --raw)"
}

# First control plane only: reports /etc/kubernetes/admin.conf on the secret line.
export def export-kubeconfig [] {
    if ($ADMIN_CONF | path exists) {
        print (kubeconfig-secret-line (open --raw $ADMIN_CONF | decode utf-8))
    }
}

# Servers of the Cluster (or this TaskServ's peers) that are not nodes yet.
export def not-yet-joined [ctx: record, nodes: list<string>]: nothing -> list<string> {
    let servers = ($ctx | get -o cluster.servers | default [])
    let members = if ($servers | is-not-empty) { $servers | get name } else { members $ctx | get name }
    $members | where {|m| $m not-in $nodes } | sort
}

# The InitConfiguration `kubeadm token create --config` reads: the generated bootstrap token
# again, for JOIN_TOKEN_TTL only (JSON is YAML; written to a 0600 file, never on a command line).
export def token-config [ctx: record]: nothing -> string {
    {
        apiVersion: "kubeadm.k8s.io/v1beta4"
        kind: InitConfiguration
        bootstrapTokens: [{
            token: $ctx.config.bootstrapToken
            ttl: $JOIN_TOKEN_TTL
            usages: [signing authentication]
            groups: ["system:bootstrappers:kubeadm:default-node-token"]
            description: "provisioning: join of a late member"
        }]
        # For `kubeadm init phase upload-certs`: the control-plane certificates a joining
        # control plane downloads (kubeadm deletes the uploaded copy after two hours).
        certificateKey: $ctx.config.certificateKey
    } | to json
}

# First control plane, on every health check: while a server of the Cluster has not joined
# (a scale-up days after init, when kubeadm init's token has long expired), the bootstrap
# token exists again for JOIN_TOKEN_TTL (and, for a control plane, the uploaded certificates
# again); once every server is a node the token is left to expire.
export def ensure-join-token [ctx: record] {
    let nodes = (kubectl get nodes -o "jsonpath={.items[*].metadata.name}")
    if $nodes.exit_code != 0 { return }
    let pending = (not-yet-joined $ctx ($nodes.stdout | split row " " | where {|n| $n != "" }))
    if ($pending | is-empty) { return }
    let id = ($ctx.config.bootstrapToken | split row "." | first)
    # Only the ids are read: the listing holds whole tokens and is never printed.
    let listed = (^kubeadm token list --kubeconfig $ADMIN_CONF -o "jsonpath={.token}{\"\\n\"}" | complete)
    let ids = ($listed.stdout | lines | each {|t| $t | split row "." | first })
    if $listed.exit_code == 0 and ($id in $ids) { return }
    log $"join token renewed for ($pending | str join ', ') \(valid ($JOIN_TOKEN_TTL)\)"
    write-secret-file /etc/kubernetes/kubeadm-token.yaml (token-config $ctx) | ignore
    # kubeadm prints the token it created: captured, never shown.
    let created = (^kubeadm token create --kubeconfig $ADMIN_CONF --config /etc/kubernetes/kubeadm-token.yaml | complete)
    if $created.exit_code != 0 { log "could not renew the join token (kubeadm token create failed)" }
    # A late control plane also needs the uploaded certificates again (they expire after 2 h).
    let cps = (control-planes $ctx | get name)
    if ($pending | any {|p| $p in $cps }) {
        # kubeadm prints the certificate key it used: captured, never shown.
        let uploaded = (^kubeadm init phase upload-certs --upload-certs --config /etc/kubernetes/kubeadm-token.yaml | complete)
        if $uploaded.exit_code != 0 { log "could not upload the control-plane certificates again (kubeadm init phase upload-certs failed)" }
    }
}
