# Password hashes for services with built-in basic auth (docker-registry's htpasswd,
# prometheus/alertmanager web config). Passwords travel on stdin, never in argv.

use pkg.nu [apt-install]

# A bcrypt hash of `password` for `user`: `current` (a hash from the file install wrote
# before) when it still matches, so an unchanged password leaves the file unchanged (bcrypt
# salts differ on every run); a fresh hash otherwise. Needs htpasswd (apache2-utils).
export def bcrypt-hash [user: string, password: string, current: string = ""]: nothing -> string {
    apt-install apache2-utils
    if $current != "" {
        let tmp = (^mktemp | str trim)
        $"($user):($current)\n" | save --force --raw $tmp
        let ok = (($password | ^htpasswd -vi $tmp $user | complete).exit_code == 0)
        rm -f $tmp
        if $ok { return $current }
    }
    let r = ($password | ^htpasswd -niB -C 10 $user | complete)
    if $r.exit_code != 0 { error make {msg: $"htpasswd could not hash the password for ($user): ($r.stderr | str trim)"} }
    $r.stdout | str trim | split row ":" | skip 1 | str join ":"
}

# The hash recorded for `user` in an htpasswd file ("" when absent).
export def htpasswd-hash-of [path: string, user: string]: nothing -> string {
    if not ($path | path exists) { return "" }
    let line = (open --raw $path | decode utf-8 | lines | where {|l| $l starts-with $"($user):" } | get -o 0 | default "")
    $line | split row ":" | skip 1 | str join ":"
}

# Writes a Prometheus-style web config (exporter-toolkit: prometheus, alertmanager) that
# requires basic auth for `user`; returns whether the file changed. Readable by `group`.
export def write-web-config [path: string, user: string, password: string, --group: string = "root"]: nothing -> bool {
    let current = if ($path | path exists) {
        try { open --raw $path | decode utf-8 | from yaml | get -o basic_auth_users | default {} | get -o $user | default "" } catch { "" }
    } else { "" }
    let hash = (bcrypt-hash $user $password $current)
    let text = $"# Written by the provisioning taskserv: basic auth for every HTTP endpoint.\n({basic_auth_users: {$user: $hash}} | to yaml)"
    mkdir ($path | path dirname)
    let changed = if ($path | path exists) { (open --raw $path | decode utf-8) != $text } else { true }
    if $changed { $text | save --force --raw $path }
    ^chown $"root:($group)" $path
    ^chmod 0640 $path
    $changed
}
