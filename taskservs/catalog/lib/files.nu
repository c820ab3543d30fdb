# Writing files, rendered templates in particular.

# Writes `content` to `path` when it differs; returns whether it changed. Creates the parent
# directory; sets `mode` (octal string like "0644") when given.
export def write-if-changed [path: string, content: string, --mode: string = ""]: nothing -> bool {
    let current = if ($path | path exists) { open --raw $path | decode utf-8 } else { null }
    let changed = ($current != $content)
    if $changed {
        mkdir ($path | path dirname)
        $content | save --force --raw $path
    }
    if $mode != "" {
        ^chmod $mode $path
    }
    $changed
}

# Writes the rendered template `name` (from ctx.templates) to `path`; returns whether it changed.
export def write-template [ctx: record, name: string, path: string, --mode: string = ""]: nothing -> bool {
    let templates = ($ctx | get -o templates | default {})
    if not ($name in $templates) {
        error make {msg: $"template ($name) was not rendered into the context \(have: ($templates | columns | str join ', ')\)"}
    }
    write-if-changed $path ($templates | get $name) --mode $mode
}

# Where install records the digests of the config files it wrote (the drift baseline).
const STATE_DIR = "/var/lib/provisioning/taskservs"

def digest-file [service: string]: nothing -> string {
    $"($STATE_DIR)/($service)/config.sha256.json"
}

# SHA-256 of a file's bytes, or "missing" when it does not exist.
export def file-digest [path: string]: nothing -> string {
    if ($path | path exists) { open --raw $path | hash sha256 } else { "missing" }
}

# Records the digests of the config files `install.nu` just wrote: what `config-drift`
# compares against. Call it after every install (changed or not), with every file it owns.
export def record-config [service: string, paths: list<string>] {
    let digests = ($paths | each {|p| {path: $p, sha256: (file-digest $p)} })
    let file = (digest-file $service)
    mkdir ($file | path dirname)
    $digests | to json | save --force --raw $file
}

# The config files whose content differs from what install recorded: `[{path, expected,
# actual}]` (actual "missing" when deleted). No record (never installed) is drift of a
# pseudo-file naming the record, so a check never passes without a baseline.
export def config-drift [service: string]: nothing -> list<record> {
    let file = (digest-file $service)
    if not ($file | path exists) {
        return [{path: $file, expected: "recorded by install.nu", actual: "missing"}]
    }
    open --raw $file | from json | each {|d| {path: $d.path, expected: $d.sha256, actual: (file-digest $d.path)} } | where {|d| $d.expected != $d.actual }
}

# Deletes the drift baseline (remove.nu).
export def forget-config [service: string] {
    rm -rf $"($STATE_DIR)/($service)"
}
