# Helpers shared by redis's scripts.

# redis-cli against the local server; the password goes through the environment, not argv.
export def --wrapped redis-cli [ctx: record, ...args: string]: nothing -> record {
    with-env {REDISCLI_AUTH: $ctx.config.password} {
        ^redis-cli -h 127.0.0.1 -p ($ctx.config.port | into string) ...$args | complete
    }
}
