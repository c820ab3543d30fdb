# rook-ceph: Rook release manifests (pinned tag) and the CephCluster, from the first control plane.

use ../lib/ctx.nu *
use ../lib/k8s.nu *

def main [] {
    let ctx = ($in | read-context)
    let version = $ctx.taskserv.version
    if not (is-api-runner $ctx $ctx.config.controlPlanePool) {
        emit-result {version: $version, acted: false}
        return
    }
    let base = $"https://raw.githubusercontent.com/rook/rook/v($version)/deploy/examples"
    for file in [crds.yaml common.yaml operator.yaml] {
        log $"applying rook ($version) ($file)"
        let dest = $"/tmp/rook-($version)-($file)"
        let pinned = ($ctx.config.manifestSha256? | default {} | get -o $"v($version)/($file)" | default "")
        fetch $"($base)/($file)" $dest --sha256 $pinned
        kube-apply (open --raw $dest | decode utf-8)
    }
    let r = (kube -n rook-ceph rollout status deployment/rook-ceph-operator --timeout=600s)
    if $r.exit_code != 0 { fail $"rook operator did not roll out: ($r.stderr)" }
    log "applying the CephCluster"
    kube-apply ($ctx.templates | get "cephcluster.yaml")
    emit-result {version: $version, acted: true}
}
