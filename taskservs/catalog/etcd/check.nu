# etcd health: the local daemon runs, `etcdctl endpoint health` succeeds on every member, and
# etcd.conf.yml is what install wrote (else config drift, exit 3).

use ../lib/ctx.nu *
use ../lib/service.nu *
use ../lib/check.nu *
use common.nu *

def main [] {
    let ctx = ($in | read-context)
    if not (svc-running etcd --unit etcd) { fail "etcd is not running on this server" }
    let endpoints = (all-client-urls $ctx)
    let r = (etcdctl $endpoints endpoint health)
    print -n $r.stdout
    print -n $r.stderr
    if $r.exit_code != 0 { fail $"unhealthy members among ($endpoints | str join ', ')" --code 2 }
    finish-check etcd {version: $ctx.taskserv.version, endpoints: $endpoints}
}
