# postgresql health: cluster 15/main is online and answers a query, and the config files
# install wrote are unchanged (else config drift, exit 3).

use ../lib/ctx.nu *
use ../lib/check.nu *
use common.nu *

def main [] {
    let ctx = ($in | read-context)
    if not (cluster-running) { fail "cluster 15/main is not online" }
    let r = (psql-run "SELECT 1;")
    if $r.exit_code != 0 { fail $"query failed: ($r.stderr)" --code 2 }
    finish-check postgresql {version: $ctx.taskserv.version}
}
