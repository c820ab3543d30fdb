# marker remove: deletes the file (idempotent).

def main [] {
    let ctx = ($in | from json)
    rm --force $ctx.config.path
    print $"==> removed ($ctx.config.path)"
    print "PROVISIONING_RESULT {}"
}
