# Helpers shared by docker's scripts.

export const CONFIG = "/etc/docker/daemon.json"
export const SOCKET = "/run/docker.sock"
