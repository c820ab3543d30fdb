# Helpers shared by cilium's scripts.

# The chart values `cilium install`/`upgrade` set, as `--set` arguments (checked against the
# chart's values schema by taskservs/tests/kubeadm_config.rs).
export def helm-settings [config: record]: nothing -> list<string> {
    [
        "--set" $"kubeProxyReplacement=($config.kubeProxyReplacement)"
        "--set" $"ipam.mode=($config.ipamMode)"
    ]
}
