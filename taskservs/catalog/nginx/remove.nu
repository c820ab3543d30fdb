# nginx removal: stop, purge the packages, delete the config and the drift baseline.

use ../lib/ctx.nu *
use ../lib/pkg.nu *
use ../lib/files.nu *
use ../lib/service.nu *

def main [] {
    let ctx = ($in | read-context)
    svc-stop nginx --unit nginx
    apt-purge nginx nginx-common
    rm -rf /etc/nginx /var/log/nginx
    forget-config nginx
    emit-result {removed: true}
}
