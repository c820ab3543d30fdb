# redis removal: stop, purge the package, delete its data.

use ../lib/ctx.nu *
use ../lib/files.nu *
use ../lib/pkg.nu *
use ../lib/service.nu *

def main [] {
    let ctx = ($in | read-context)
    svc-stop redis --unit redis-server
    apt-purge redis-server redis-tools
    rm -rf /var/lib/redis /etc/redis
    forget-config redis
    emit-result {removed: true}
}
