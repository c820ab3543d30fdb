# crun health: the binary reports the requested version, generates an OCI spec and lists its
# state directory; the runtime registration is what install wrote (else config drift, exit 3).

use ../lib/ctx.nu *
use ../lib/check.nu *

const CONF = "/etc/containers/containers.conf.d/50-provisioning-crun.conf"

def main [] {
    let ctx = ($in | read-context)
    if (which crun | is-empty) { fail "crun is not installed" --code 2 }
    let reported = (^crun --version | complete)
    let binary = ($reported.stdout | lines | get -o 0 | default "" | str replace "crun version " "" | str trim)
    if $binary != $ctx.taskserv.version { fail $"crun reports version '($binary)', ($ctx.taskserv.version) was requested" --code 2 }
    let bundle = (^mktemp -d | str trim)
    let spec = (^crun spec --rootless -b $bundle | complete)
    let valid = (try { open --raw $"($bundle)/config.json" | decode utf-8 | from json | get ociVersion } catch { "" })
    rm -rf $bundle
    if $spec.exit_code != 0 or $valid == "" { fail $"crun spec did not produce an OCI config: ($spec.stderr | str trim)" --code 2 }
    let list = (^crun list | complete)
    if $list.exit_code != 0 { fail $"crun list failed: ($list.stderr | str trim)" --code 2 }
    finish-check crun {version: $ctx.taskserv.version, ociVersion: $valid}
}
