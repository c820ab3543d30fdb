# Helpers shared by postgresql's scripts.

export const MAJOR = "15"
export const CLUSTER = "main"
export const CONF_DIR = "/etc/postgresql/15/main"

# Whether the Debian cluster 15/main runs (pg_lsclusters works with and without systemd).
export def cluster-running []: nothing -> bool {
    if (which pg_lsclusters | is-empty) { return false }
    let r = (^pg_lsclusters --no-header | complete)
    if $r.exit_code != 0 { return false }
    $r.stdout | lines | any {|l| let f = ($l | split row -r '\s+'); ($f | get -o 0) == $MAJOR and ($f | get -o 1) == $CLUSTER and ($f | get -o 3) == "online" }
}

# Runs psql as postgres with SQL on stdin and psql variables (-v name=value: data, not SQL text).
export def psql-run [sql: string, vars: record = {}]: nothing -> record {
    let var_args = ($vars | transpose key value | each {|kv| ["-v" $"($kv.key)=($kv.value)"] } | flatten)
    $sql | ^runuser -u postgres -- psql -X -q -A -t -v ON_ERROR_STOP=1 ...$var_args | complete
}
