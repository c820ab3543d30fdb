# Reading the context and reporting the result.
#
# Every step runs as `nu --no-config-file --stdin <catalog>/<service>/<step>.nu` with the
# context (JSON) on stdin; `main` starts with `let ctx = ($in | read-context)`.

# Parses the context JSON handed on stdin.
export def read-context []: [string -> record, nothing -> record] {
    let raw = $in
    if ($raw | is-empty) {
        error make {msg: "no context on stdin (run with `nu --stdin` and the JSON context as input)"}
    }
    $raw | from json
}

# Prints the result line the runner parses: `PROVISIONING_RESULT <json>` (must be printed last).
export def emit-result [result: record] {
    print $"PROVISIONING_RESULT ($result | to json --raw)"
}

# A progress line, prefixed with the step, for the logs.
export def log [message: string] {
    print $"==> ($message)"
}

# Stops the script with a message on stderr and exit code `code`.
export def fail [message: string, --code: int = 1] {
    print --stderr $"ERROR: ($message)"
    exit $code
}

# The preferred address of a server or peer record: its first InternalIP, else its first
# address, else its name.
export def address-of [node: record]: nothing -> string {
    let addresses = ($node | get -o addresses | default [])
    let internal = ($addresses | where type == "InternalIP")
    if ($internal | is-not-empty) {
        $internal | first | get address
    } else if ($addresses | is-not-empty) {
        $addresses | first | get address
    } else {
        $node.name
    }
}

# This server and its peers, sorted by name (the same list on every member).
export def members [ctx: record]: nothing -> list<record> {
    [$ctx.server] | append ($ctx | get -o peers | default []) | sort-by name
}

# Fails with a clear message when an external command is missing (instead of nu's
# "neither a Nushell built-in or a known external command").
export def require-command [command: string, hint: string] {
    if (which $command | where type == "external" | is-empty) {
        fail $"($command) not found: ($hint)"
    }
}
