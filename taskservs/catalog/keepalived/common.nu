# Helpers shared by keepalived's scripts.

export const CONFIG = "/etc/keepalived/keepalived.conf"
export const PID = "/run/keepalived.pid"

use ../lib/caps.nu [has-capability CAP_NET_ADMIN]

# Whether this process may configure network interfaces (CAP_NET_ADMIN).
export def has-net-admin []: nothing -> bool {
    has-capability $CAP_NET_ADMIN
}

# The interface that carries `address` (`ip -o addr`), or "".
export def interface-of [address: string]: nothing -> string {
    let r = (^ip -o -4 addr show | complete)
    $r.stdout | lines | parse -r '^\d+:\s+(?<dev>[^ ]+)\s+inet\s+(?<ip>[0-9.]+)/' | where ip == $address | get -o 0.dev | default "" | str replace -r '@.*$' ''
}

# The VRRP state the daemon reports (SIGUSR1 writes /tmp/keepalived.data): MASTER, BACKUP,
# FAULT, or "" when it does not answer.
export def vrrp-state []: nothing -> string {
    if not ($PID | path exists) { return "" }
    let pid = (open --raw $PID | decode utf-8 | str trim)
    rm -f /tmp/keepalived.data
    let r = (^kill -USR1 $pid | complete)
    if $r.exit_code != 0 { return "" }
    let deadline = ((date now) + 5sec)
    while not ("/tmp/keepalived.data" | path exists) and ((date now) < $deadline) { sleep 100ms }
    sleep 200ms
    if not ("/tmp/keepalived.data" | path exists) { return "" }
    let data = (open --raw /tmp/keepalived.data | decode utf-8 | lines)
    let after = ($data | skip until {|l| $l =~ 'VRRP Instance = provisioning' })
    $after | where {|l| $l =~ '^\s*State = (MASTER|BACKUP|FAULT|INIT)\s*$' } | get -o 0 | default "" | str replace -r '.*State = ' '' | str trim
}
