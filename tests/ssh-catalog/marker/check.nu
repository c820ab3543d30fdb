# marker health: the file is there.

def main [] {
    let ctx = ($in | from json)
    if not ($ctx.config.path | path exists) {
        print --stderr $"ERROR: ($ctx.config.path) is missing"
        exit 1
    }
    print $"PROVISIONING_RESULT ({healthy: true, version: $ctx.taskserv.version} | to json --raw)"
}
