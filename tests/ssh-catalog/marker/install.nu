# marker install: writes "<server> <version>" to config.path.

def main [] {
    let ctx = ($in | from json)
    let path = $ctx.config.path
    mkdir ($path | path dirname)
    $"($ctx.server.name) ($ctx.taskserv.version)\n" | save --force $path
    print $"==> wrote ($path) on ($ctx.server.name)"
    print $"PROVISIONING_RESULT ({version: $ctx.taskserv.version} | to json --raw)"
}
