# keepalived health: the daemon runs, its config parses (keepalived -t), it reports a VRRP
# state (MASTER or BACKUP), a MASTER holds the floating address — unless the machine lacks
# CAP_NET_ADMIN, which the result says (vipAssigned false, limitation) — and
# keepalived.conf is what install wrote (else config drift, exit 3).

use ../lib/ctx.nu *
use ../lib/service.nu *
use ../lib/check.nu *
use common.nu *

def main [] {
    let ctx = ($in | read-context)
    if not (svc-running keepalived --unit keepalived) { fail "keepalived is not running" --code 2 }
    let t = (^keepalived -t -f $CONFIG | complete)
    if $t.exit_code != 0 { fail $"($CONFIG) does not parse:\n($t.stdout)($t.stderr)" --code 2 }
    let state = (vrrp-state)
    if $state not-in [MASTER BACKUP] { fail $"keepalived reports VRRP state '($state)', expected MASTER or BACKUP" --code 2 }
    let vip = ($ctx.config.virtualAddress | split row "/" | first)
    let assigned = ((^ip -o -4 addr show | complete).stdout | lines | any {|l| $l =~ $"inet ($vip | str replace --all '.' '\.')/" })
    let capable = (has-net-admin)
    if $state == "MASTER" and $capable and not $assigned { fail $"keepalived is MASTER but ($vip) is not on any interface" --code 2 }
    let limitation = if $capable { "" } else { "no CAP_NET_ADMIN on this machine (unprivileged container): VRRP runs, the floating address cannot be added" }
    finish-check keepalived {version: $ctx.taskserv.version, state: $state, vipAssigned: $assigned, limitation: $limitation}
}
