# postgresql health: cluster 15/main is online and answers a query.

use ../lib/ctx.nu *
use common.nu *

def main [] {
    let ctx = ($in | read-context)
    if not (cluster-running) { fail "cluster 15/main is not online" }
    let r = (psql-run "SELECT 1;")
    if $r.exit_code != 0 { fail $"query failed: ($r.stderr)" --code 2 }
    emit-result {healthy: true, version: $ctx.taskserv.version}
}
