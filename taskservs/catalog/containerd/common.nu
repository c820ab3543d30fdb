# Helpers shared by containerd's scripts.

export const CONFIG = "/etc/containerd/config.toml"
export const SOCKET = "/run/containerd/containerd.sock"

# Whether overlayfs can be mounted here (it cannot on an overlay root inside Docker).
export def overlay-works []: nothing -> bool {
    let dir = (^mktemp -d | str trim)
    for d in [lower upper work merged] { mkdir $"($dir)/($d)" }
    let r = (^mount -t overlay overlay -o $"lowerdir=($dir)/lower,upperdir=($dir)/upper,workdir=($dir)/work" $"($dir)/merged" | complete)
    if $r.exit_code == 0 { ^umount $"($dir)/merged" | complete | ignore }
    rm -rf $dir
    $r.exit_code == 0
}

# `ctr version` against the socket: the server's version, or null when it does not answer.
export def server-version []: nothing -> any {
    let r = (^ctr --address $SOCKET --timeout 5s version | complete)
    if $r.exit_code != 0 { return null }
    let server = ($r.stdout | split row "Server:" | get -o 1 | default "")
    let line = ($server | lines | where {|l| ($l | str trim) starts-with "Version:" } | get -o 0)
    if $line == null { null } else { $line | str replace -r '.*Version:\s*' '' | str trim }
}
