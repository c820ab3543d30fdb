# Helpers shared by etcd's scripts.

use ../lib/ctx.nu [address-of members]

# Client URL of a server or peer record.
export def client-url [ctx: record, node: record]: nothing -> string {
    $"http://(address-of $node):($ctx.config.clientPort)"
}

# Client URLs of every member (this server included), sorted by member name.
export def all-client-urls [ctx: record]: nothing -> list<string> {
    members $ctx | each {|m| client-url $ctx $m }
}

# Runs etcdctl (API v3) against the given endpoints; returns the `complete` record.
export def --wrapped etcdctl [endpoints: list<string>, ...args: string]: nothing -> record {
    with-env {ETCDCTL_API: "3"} {
        ^etcdctl --dial-timeout=2s --command-timeout=5s --endpoints ($endpoints | str join ",") ...$args | complete
    }
}

# The member list seen through one of `endpoints` — records {id (hex), status, name,
# peerURLs, clientURLs; a member that never started has no clientURLs} — or null when none answers. The simple format is parsed because the JSON one
# prints 64-bit ids as numbers, which do not survive a float.
export def member-list [endpoints: list<string>]: nothing -> any {
    for endpoint in $endpoints {
        let r = (etcdctl [$endpoint] member list -w simple)
        if $r.exit_code == 0 {
            return ($r.stdout | lines | where {|l| ($l | str trim) != "" } | each {|l|
                let f = ($l | split row ", ")
                {id: ($f | get 0), status: ($f | get -o 1 | default ""), name: ($f | get -o 2 | default ""), peerURLs: ($f | get -o 3 | default "" | split row "," | where {|u| $u != "" }), clientURLs: ($f | get -o 4 | default "" | split row "," | where {|u| $u != "" })}
            })
        }
    }
    null
}

# `member remove <id>`, retried while etcd refuses with "unhealthy cluster": its strict
# reconfig check waits until the members it keeps have been connected for a few seconds.
export def remove-member [endpoints: list<string>, id: string, --timeout: duration = 30sec]: nothing -> record {
    mut r = (etcdctl $endpoints member remove $id)
    let deadline = ((date now) + $timeout)
    while $r.exit_code != 0 and ($r.stderr | str contains "unhealthy cluster") and (date now) < $deadline {
        sleep 1sec
        $r = (etcdctl $endpoints member remove $id)
    }
    $r
}
