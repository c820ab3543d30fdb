# Linux capabilities of the machine (what an unprivileged container lacks).

# Whether this process has capability number `bit` in its effective set (CapEff).
export def has-capability [bit: int]: nothing -> bool {
    let hex = (open --raw /proc/self/status | decode utf-8 | lines | where {|l| $l starts-with "CapEff:" } | first | str replace "CapEff:" "" | str trim)
    (($"0x($hex)" | into int) | bits and (1 | bits shl $bit)) != 0
}

# CAP_SYS_ADMIN: what podman and buildah need (as root they otherwise act rootless and need
# user namespaces, which Docker's default seccomp profile refuses).
export const CAP_SYS_ADMIN = 21

# CAP_NET_ADMIN: adding addresses (keepalived), iptables and bridges (docker).
export const CAP_NET_ADMIN = 12

# Whether overlayfs can be mounted here (not on an overlay root inside Docker, nor without
# CAP_SYS_ADMIN).
export def overlay-mountable []: nothing -> bool {
    let dir = (^mktemp -d | str trim)
    for d in [lower upper work merged] { mkdir $"($dir)/($d)" }
    let r = (^mount -t overlay overlay -o $"lowerdir=($dir)/lower,upperdir=($dir)/upper,workdir=($dir)/work" $"($dir)/merged" | complete)
    if $r.exit_code == 0 { ^umount $"($dir)/merged" | complete | ignore }
    rm -rf $dir
    $r.exit_code == 0
}

# Fails (exit 1) naming what is missing when the machine cannot run `what` (podman, buildah):
# checked before anything is installed, so an unprivileged container gets a clear reason.
export def require-sys-admin [what: string] {
    if not (has-capability $CAP_SYS_ADMIN) {
        print --stderr $"ERROR: ($what) cannot run on this machine: it lacks CAP_SYS_ADMIN \(an unprivileged container\); as root without it, ($what) acts rootless and needs user namespaces, which the container's seccomp profile refuses. Give the machine CAP_SYS_ADMIN and unshare \(local provider: the provisioning.dev/privileged tag\)."
        exit 1
    }
}
