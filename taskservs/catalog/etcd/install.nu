# etcd: install Debian's etcd-server (3.4.23), write the config, start the member, and join an
# existing cluster when the peers already run one (scale-up, or a member rebuilt empty).
# Returns once the daemon runs: the cluster is healthy only when a quorum of members is up.

use ../lib/ctx.nu *
use ../lib/pkg.nu *
use ../lib/files.nu *
use ../lib/service.nu *
use common.nu *

const CONFIG = "/etc/etcd/provisioning.yml"

def main [] {
    let ctx = ($in | read-context)
    let version = $ctx.taskserv.version
    if $version != "3.4.23" { fail $"etcd ($version) is not installable here: Debian bookworm ships 3.4.23" }

    log "installing etcd-server and etcd-client"
    apt-install etcd-server etcd-client
    let package_version = (upstream-version (installed-version etcd-server))
    if $package_version != $version { fail $"etcd-server ($package_version) is installed, ($version) was requested" }

    # TLS first: etcdctl needs the member certificate to talk to the peers below.
    let pki_changed = (ensure-pki $ctx (address-of $ctx.server))

    let data_dir = $ctx.config.dataDir
    let initialised = ($"($data_dir)/member" | path exists)
    mut config = ($ctx.templates."etcd.conf.yml" | from yaml)
    let my_peer_url = $config."initial-advertise-peer-urls"

    if $initialised {
        # initial-* settings only matter at bootstrap; keep the ones this member started with
        # so that a changed peer list does not restart every member at once.
        if ($CONFIG | path exists) {
            let previous = (open --raw $CONFIG | decode utf-8 | from yaml)
            for key in ["initial-cluster" "initial-cluster-state" "initial-cluster-token"] {
                if $key in $previous { $config = ($config | upsert $key ($previous | get $key)) }
            }
        }
    } else {
        let peer_endpoints = ($ctx.peers | each {|p| client-url $ctx $p })
        let existing = if ($peer_endpoints | is-empty) { null } else { member-list $peer_endpoints }
        if $existing != null {
            let mine = ($existing | where {|m| $my_peer_url in $m.peerURLs })
            let unstarted_slot = ($mine | where {|m| $m.clientURLs | is-empty } | is-not-empty)
            if $unstarted_slot {
                # This server is listed but never started: a founding member that comes late,
                # or one already added with `member add`. Either way it joins the running
                # cluster as it is ("existing"), with the cluster's own member list.
                log "the running cluster lists this server as not yet started: joining it"
                let initial = ($existing | each {|m|
                    let name = if $m.name != "" { $m.name } else if ($my_peer_url in $m.peerURLs) { $ctx.server.name } else { $m.id }
                    $m.peerURLs | each {|u| $"($name)=($u)" }
                } | flatten | str join ",")
                $config = ($config | upsert "initial-cluster" $initial | upsert "initial-cluster-state" "existing")
            } else {
                # Replace a stale entry of this server (rebuilt with an empty data dir).
                let stale = ($existing | where {|m| $m.name == $ctx.server.name or ($my_peer_url in $m.peerURLs) })
                for m in $stale {
                    let id = $m.id
                    log $"removing stale member entry ($m.name) \(($id)\)"
                    let r = (remove-member $peer_endpoints $id)
                    if $r.exit_code != 0 { fail $"member remove ($id) failed: ($r.stderr)" }
                }
                log "adding this server to the running cluster"
                let r = (etcdctl $peer_endpoints member add $ctx.server.name $"--peer-urls=($my_peer_url)")
                if $r.exit_code != 0 { fail $"member add failed: ($r.stderr)" }
                let initial = ($r.stdout | lines | where {|l| $l starts-with "ETCD_INITIAL_CLUSTER=" } | first | str replace "ETCD_INITIAL_CLUSTER=" "" | str trim -c '"')
                $config = ($config | upsert "initial-cluster" $initial | upsert "initial-cluster-state" "existing")
            }
        }
        mkdir $data_dir
        ^chown etcd:etcd $data_dir
        ^chmod 0700 $data_dir
    }

    let changed = (write-if-changed $CONFIG ($config | to yaml) --mode "0644") or $pki_changed
    if (has-systemd) {
        write-if-changed /etc/default/etcd $"DAEMON_ARGS=\"--config-file ($CONFIG)\"\n" | ignore
    }
    record-config etcd [$CONFIG]
    log (if $changed { "configuration changed: (re)starting etcd" } else { "configuration unchanged" })
    svc-start etcd [/usr/bin/etcd --config-file $CONFIG] --user etcd --unit etcd --restart=$changed
    if not $initialised {
        # A member that fails its first start (wrong cluster view) must not leave a half-made
        # data dir behind: the next run would take it for an initialised member.
        sleep 2sec
        if not (svc-running etcd --unit etcd) {
            rm -rf $"($data_dir)/member"
            let tail = (try { open --raw (log-file etcd) | decode utf-8 | lines | last 15 | str join "\n" } catch { "" })
            fail $"etcd exited during its first start; data dir reset for the next attempt. Log tail:\n($tail)"
        }
    }

    emit-result {
        version: $version
        packageVersion: (installed-version etcd-server)
        member: $ctx.server.name
        clusterState: $config."initial-cluster-state"
        endpoints: [(client-url $ctx $ctx.server)]
    }
}
