# buildah health: builds an image from scratch (a label, commit), inspects it and deletes it;
# storage.conf and the isolation setting are what install wrote (else config drift, exit 3).

use ../lib/ctx.nu *
use ../lib/check.nu *

def main [] {
    let ctx = ($in | read-context)
    if (which buildah | is-empty) { fail "buildah is not installed" --code 2 }
    let image = $"localhost/provisioning-check-(random chars --length 8 | str downcase)"
    let from = (^buildah from --quiet scratch | complete)
    if $from.exit_code != 0 { fail $"buildah from scratch failed: ($from.stderr | str trim)" --code 2 }
    let container = ($from.stdout | str trim)
    let built = (do {
        let c = (^buildah config --label provisioning.dev/check=true $container | complete)
        if $c.exit_code != 0 { return $"buildah config: ($c.stderr | str trim)" }
        let m = (^buildah commit --quiet --rm $container $image | complete)
        if $m.exit_code != 0 { return $"buildah commit: ($m.stderr | str trim)" }
        let i = (^buildah inspect --type image --format "{{ index .OCIv1.Config.Labels \"provisioning.dev/check\" }}" $image | complete)
        if ($i.stdout | str trim) != "true" { return $"buildah inspect: the committed image has no label \(($i.stderr | str trim)\)" }
        ""
    })
    ^buildah rm $container | complete | ignore
    ^buildah rmi $image | complete | ignore
    if $built != "" { fail $built --code 2 }
    let v = (^buildah version --json | complete)
    let binary = (try { $v.stdout | from json | get version } catch { "" })
    if $binary != $ctx.taskserv.version { fail $"buildah reports version '($binary)', ($ctx.taskserv.version) was requested" --code 2 }
    finish-check buildah {version: $ctx.taskserv.version, built: true}
}
