# kubernetes: kubelet/kubeadm/kubectl from pkgs.k8s.io (pinned), host prerequisites, then
# `kubeadm init` on the first control plane or `kubeadm join` on the others. Idempotent: a
# node that already has /etc/kubernetes/kubelet.conf is not initialised or joined again.

use ../lib/ctx.nu *
use ../lib/pkg.nu *
use ../lib/files.nu *
use ../lib/net.nu *
use common.nu *

def main [] {
    let ctx = ($in | read-context)
    if not (has-systemd) { fail "kubernetes needs systemd (kubelet runs as a unit): cloud machines only" }
    let version = $ctx.taskserv.version
    let minor = (minor-of $version)

    log "host prerequisites: swap off, br_netfilter, forwarding"
    ^swapoff -a
    ^sed -i -e '/\sswap\s/s/^#*/#/' /etc/fstab
    write-if-changed /etc/modules-load.d/k8s.conf "overlay\nbr_netfilter\n" | ignore
    ^modprobe overlay
    ^modprobe br_netfilter
    write-if-changed /etc/sysctl.d/k8s.conf "net.bridge.bridge-nf-call-iptables = 1\nnet.bridge.bridge-nf-call-ip6tables = 1\nnet.ipv4.ip_forward = 1\n" | ignore
    ^sysctl --system | ignore

    log $"apt repository pkgs.k8s.io ($minor)"
    apt-install apt-transport-https ca-certificates curl gpg
    let keyring = $"/etc/apt/keyrings/kubernetes-($minor).gpg"
    if not ($keyring | path exists) {
        mkdir /etc/apt/keyrings
        ^curl -fsSL --retry 5 -o /tmp/k8s-release.key $"https://pkgs.k8s.io/core:/stable:/($minor)/deb/Release.key"
        verify-key-fingerprint /tmp/k8s-release.key $K8S_APT_KEY_FINGERPRINT
        ^gpg --dearmor --yes -o $keyring /tmp/k8s-release.key
    }
    let repo = $"deb [signed-by=($keyring)] https://pkgs.k8s.io/core:/stable:/($minor)/deb/ /\n"
    if (write-if-changed /etc/apt/sources.list.d/kubernetes.list $repo) { apt-retry [update -q] }

    let current = (installed-version kubeadm)
    if $current == null or not ((upstream-version $current) == $version) {
        log $"installing kubelet, kubeadm, kubectl ($version)"
        ^apt-mark unhold kubelet kubeadm kubectl | complete | ignore
        let pin = $"=($version)-*"
        apt-retry [install -y -q --allow-downgrades --allow-change-held-packages $"kubelet($pin)" $"kubeadm($pin)" $"kubectl($pin)"]
        ^apt-mark hold kubelet kubeadm kubectl
    }
    ^systemctl enable --now kubelet

    let role = (role $ctx)
    let endpoint = (api-endpoint $ctx)
    if ("/etc/kubernetes/kubelet.conf" | path exists) {
        log $"node already part of a cluster \(role ($role)\)"
        if $role == "init" and ($current != null) and ((upstream-version $current) != $version) {
            log $"upgrading the control plane to ($version)"
            ^kubeadm upgrade apply -y $"v($version)"
        } else if ($current != null) and ((upstream-version $current) != $version) {
            ^kubeadm upgrade node
        }
        ^systemctl restart kubelet
    } else if $role == "init" {
        # The cluster CA from the generated caKey, so joining servers can pin it by hash.
        write-secret-file /etc/kubernetes/pki/ca.key $ctx.config.caKey | ignore
        if not ("/etc/kubernetes/pki/ca.crt" | path exists) {
            ^openssl req -x509 -new -key /etc/kubernetes/pki/ca.key -sha256 -days 3650 -subj "/CN=kubernetes" -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,digitalSignature,keyEncipherment,keyCertSign" -out /etc/kubernetes/pki/ca.crt
        }
        # The rendered config holds the token and certificate key: 0600 from the start.
        write-secret-file /etc/kubernetes/kubeadm-init.yaml ($ctx.templates | get "kubeadm-init.yaml") | ignore
        log "kubeadm init"
        # --skip-*-print: kubeadm would print the token, the certificate key and whole join
        # commands into the output that goes to logs and status.
        ^kubeadm init --config /etc/kubernetes/kubeadm-init.yaml --upload-certs --skip-token-print --skip-certificate-key-print
    } else {
        let api = (split-endpoint $endpoint)
        wait-port $api.host $api.port --timeout 600sec
        let ca_hash = (ca-cert-hash $ctx.config.caKey)
        write-secret-file /etc/kubernetes/kubeadm-join.yaml (join-config-for $ctx $ca_hash) | ignore
        log $"kubeadm join \(($role)\)"
        ^kubeadm join --config /etc/kubernetes/kubeadm-join.yaml
    }
    if $role == "init" { export-kubeconfig }
    emit-result {
        version: $version
        role: $role
        packageVersion: (installed-version kubeadm)
        endpoints: [$"https://($endpoint)"]
    }
}
