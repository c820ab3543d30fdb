# Helpers shared by podman's scripts.

export const ENGINE_CONF = "/etc/containers/containers.conf.d/40-provisioning-podman.conf"
export const SOCKET = "/run/podman/podman.sock"
