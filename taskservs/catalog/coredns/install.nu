# coredns: Corefile, image version and replicas of kube-system/coredns, from the first control plane.

use ../lib/ctx.nu *
use ../lib/k8s.nu *

def main [] {
    let ctx = ($in | read-context)
    let version = $ctx.taskserv.version
    if not (is-api-runner $ctx $ctx.config.controlPlanePool) {
        emit-result {version: $version, acted: false}
        return
    }
    let configmap = {
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: coredns, namespace: kube-system}
        data: {Corefile: ($ctx.templates | get Corefile)}
    }
    log "applying the Corefile"
    kube-apply ($configmap | to json)
    for args in [
        [-n kube-system set image deployment/coredns $"coredns=registry.k8s.io/coredns/coredns:v($version)"]
        [-n kube-system scale deployment/coredns $"--replicas=($ctx.config.replicas)"]
        [-n kube-system rollout restart deployment/coredns]
        [-n kube-system rollout status deployment/coredns --timeout=300s]
    ] {
        let r = (kube ...$args)
        print -n $r.stdout
        if $r.exit_code != 0 { fail $"kubectl ($args | str join ' '): ($r.stderr)" }
    }
    emit-result {version: $version, acted: true}
}
