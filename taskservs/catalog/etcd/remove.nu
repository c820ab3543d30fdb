# etcd removal: leave the cluster when the others still form one (best effort: on a full
# teardown they may be gone already), stop the daemon, purge the packages and the data.

use ../lib/ctx.nu *
use ../lib/files.nu *
use ../lib/pkg.nu *
use ../lib/service.nu *
use common.nu *

const CONFIG = "/etc/etcd/provisioning.yml"

def main [] {
    let ctx = ($in | read-context)
    if (installed-version etcd-client) != null {
        let peer_endpoints = ($ctx.peers | each {|p| client-url $ctx $p })
        let members = if ($peer_endpoints | is-empty) { null } else { member-list $peer_endpoints }
        if $members != null {
            for m in ($members | where {|m| $m.name == $ctx.server.name }) {
                let id = $m.id
                log $"leaving the cluster \(member ($id)\)"
                let r = (remove-member $peer_endpoints $id)
                if $r.exit_code != 0 { print $"member remove failed \(continuing\): ($r.stderr)" } else { print -n $r.stdout }
            }
        }
    }
    svc-stop etcd --unit etcd
    apt-purge etcd-server etcd-client
    rm -rf $ctx.config.dataDir $CONFIG
    forget-config etcd
    emit-result {removed: true}
}
