# postgresql: install Debian's postgresql-15, configure cluster 15/main, start it, create the
# configured role and database (idempotent).

use ../lib/ctx.nu *
use ../lib/pkg.nu *
use ../lib/files.nu *
use ../lib/net.nu *
use common.nu *

def main [] {
    let ctx = ($in | read-context)
    let version = $ctx.taskserv.version
    if $version != $MAJOR { fail $"postgresql ($version) is not installable here: Debian bookworm ships 15" }

    log "installing postgresql-15"
    apt-install $"postgresql-($MAJOR)"
    if not ($CONF_DIR | path exists) {
        log "creating cluster 15/main"
        ^pg_createcluster $MAJOR $CLUSTER
    }
    let conf_changed = (write-template $ctx "provisioning.conf" $"($CONF_DIR)/conf.d/provisioning.conf" --mode "0644")
    let hba_changed = (write-template $ctx "pg_hba.conf" $"($CONF_DIR)/pg_hba.conf" --mode "0640")
    ^chown postgres:postgres $"($CONF_DIR)/pg_hba.conf" $"($CONF_DIR)/conf.d/provisioning.conf"
    record-config postgresql [$"($CONF_DIR)/conf.d/provisioning.conf" $"($CONF_DIR)/pg_hba.conf"]

    if (has-systemd) {
        ^systemctl enable $"postgresql@($MAJOR)-($CLUSTER)"
    }
    if not (cluster-running) {
        log "starting cluster 15/main"
        if (has-systemd) { ^systemctl start $"postgresql@($MAJOR)-($CLUSTER)" } else { ^pg_ctlcluster $MAJOR $CLUSTER start }
    } else if $conf_changed or $hba_changed {
        log "configuration changed: restarting cluster 15/main"
        if (has-systemd) { ^systemctl restart $"postgresql@($MAJOR)-($CLUSTER)" } else { ^pg_ctlcluster $MAJOR $CLUSTER restart }
    }
    wait-port 127.0.0.1 $ctx.config.port --timeout 60sec
    wait-until "postgres to accept queries" { (psql-run "SELECT 1;" | get exit_code) == 0 } --timeout 60sec

    let user = $ctx.config.user
    if $user != "" {
        log $"ensuring role ($user)"
        # The password reaches psql on stdin (a `\set` line, hex-encoded so that no quoting
        # can break it), never on a command line where `ps` would show it.
        let password_hex = ($ctx.config.password | encode hex)
        let sql = $"\\set password_hex '($password_hex)'
SELECT format\('CREATE ROLE %I LOGIN', :'role'\) WHERE NOT EXISTS \(SELECT 1 FROM pg_roles WHERE rolname = :'role'\) \\gexec
SELECT format\('ALTER ROLE %I PASSWORD %L', :'role', convert_from\(decode\(:'password_hex', 'hex'\), 'UTF8'\)\) \\gexec
"
        let r = (psql-run $sql {role: $user})
        if $r.exit_code != 0 { fail $"creating role ($user) failed: ($r.stderr)" }
    }
    let database = $ctx.config.database
    if $database != "" {
        log $"ensuring database ($database)"
        let owner = if $user != "" { $user } else { "postgres" }
        let sql = "SELECT format('CREATE DATABASE %I OWNER %I', :'db', :'owner') WHERE NOT EXISTS (SELECT 1 FROM pg_database WHERE datname = :'db') \\gexec
"
        let r = (psql-run $sql {db: $database, owner: $owner})
        if $r.exit_code != 0 { fail $"creating database ($database) failed: ($r.stderr)" }
    }
    let server_version = (psql-run "SHOW server_version;" | get stdout | str trim)
    emit-result {
        version: $version
        packageVersion: (installed-version $"postgresql-($MAJOR)")
        serverVersion: $server_version
        endpoints: [$"postgresql://(address-of $ctx.server):($ctx.config.port)"]
    }
}
