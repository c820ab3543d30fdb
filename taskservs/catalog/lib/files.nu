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
