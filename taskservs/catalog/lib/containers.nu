# /etc/containers settings shared by podman and buildah (containers-storage).

use caps.nu [overlay-mountable]

export const STORAGE_CONF = "/etc/containers/storage.conf"

# The storage driver for `requested` (auto = overlay when it can be mounted, else vfs).
export def storage-driver [requested: string]: nothing -> string {
    if $requested != "auto" { return $requested }
    if (overlay-mountable) { "overlay" } else { "vfs" }
}

# storage.conf for `driver` (the same text from podman and buildah: they share the store).
export def storage-conf [driver: string]: nothing -> string {
    $"# Written by the provisioning podman/buildah taskservs: the containers-storage store they share.\n({storage: {driver: $driver, runroot: "/run/containers/storage", graphroot: "/var/lib/containers/storage"}} | to toml)"
}
