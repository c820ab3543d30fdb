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

# The member list seen through one of `endpoints`, or null when none answers.
export def member-list [endpoints: list<string>]: nothing -> any {
    for endpoint in $endpoints {
        let r = (etcdctl [$endpoint] member list -w json)
        if $r.exit_code == 0 {
            return ($r.stdout | from json | get -o members | default [])
        }
    }
    null
}
