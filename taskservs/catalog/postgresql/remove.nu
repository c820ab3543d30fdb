# postgresql removal: stop and drop cluster 15/main, purge the packages. Data is deleted.

use ../lib/ctx.nu *
use ../lib/files.nu *
use ../lib/pkg.nu *
use common.nu *

def main [] {
    let ctx = ($in | read-context)
    if (installed-version $"postgresql-($MAJOR)") != null and ($CONF_DIR | path exists) {
        log "dropping cluster 15/main"
        ^pg_dropcluster --stop $MAJOR $CLUSTER | complete | ignore
    }
    apt-purge $"postgresql-($MAJOR)" postgresql-common postgresql-client-common $"postgresql-client-($MAJOR)"
    rm -rf $"/var/lib/postgresql/($MAJOR)" $"/etc/postgresql/($MAJOR)"
    forget-config postgresql
    emit-result {removed: true}
}
