# Debian packages: install with retries, remove, report versions.

# Whether systemd runs this machine (cloud VMs: yes; local containers: no).
export def has-systemd []: nothing -> bool {
    "/run/systemd/system" | path exists
}

# Runs apt-get with the given arguments, retrying `attempts` times (locks, flaky mirrors).
# Output streams as it comes (long installs show progress in the logs).
export def apt-retry [args: list<string>, --attempts: int = 5] {
    mut attempt = 1
    loop {
        let ok = try {
            with-env {DEBIAN_FRONTEND: "noninteractive"} {
                ^apt-get -o DPkg::Lock::Timeout=120 -o Acquire::Retries=3 ...$args
            }
            true
        } catch { false }
        if $ok { return }
        if $attempt >= $attempts {
            error make {msg: $"apt-get ($args | str join ' ') failed after ($attempt) attempts"}
        }
        print $"apt-get failed, retrying in ($attempt * 3)s"
        sleep ($attempt * 3 * 1sec)
        $attempt += 1
    }
}

# Installed version of a package (Debian version string), or null.
export def installed-version [package: string]: nothing -> any {
    let r = (^dpkg-query -W -f '${Status}\t${Version}' $package | complete)
    if $r.exit_code != 0 { return null }
    let parts = ($r.stdout | split row "\t")
    if ($parts | first | str ends-with "installed") and not ($parts | first | str contains "not-installed") {
        $parts | get 1
    } else {
        null
    }
}

# Installs packages unless they are all installed already. Without systemd, package scripts
# must not start daemons (we start them ourselves), so a temporary policy-rc.d forbids it.
export def apt-install [...packages: string] {
    let missing = ($packages | where {|p| (installed-version $p) == null })
    if ($missing | is-empty) { return }
    let policy = "/usr/sbin/policy-rc.d"
    let temporary_policy = (not (has-systemd)) and not ($policy | path exists)
    if $temporary_policy {
        "#!/bin/sh\nexit 101\n" | save --force $policy
        ^chmod 0755 $policy
    }
    let lists = (ls /var/lib/apt/lists | where name =~ "_Packages" | length)
    try {
        if $lists == 0 { apt-retry [update -q] }
        try {
            apt-retry ([install -y -q --no-install-recommends] | append $missing) --attempts 2
        } catch {
            # A stale package list is the usual cause: refresh once, then try again.
            apt-retry [update -q]
            apt-retry ([install -y -q --no-install-recommends] | append $missing)
        }
    } catch {|e|
        if $temporary_policy { rm -f $policy }
        error make {msg: $e.msg}
    }
    if $temporary_policy { rm -f $policy }
}

# The versions of a package the configured apt sources offer (`apt-cache madison`), newest first.
export def available-versions [package: string]: nothing -> list<string> {
    let r = (^apt-cache madison $package | complete)
    if $r.exit_code != 0 { return [] }
    $r.stdout | lines | each {|l| $l | split row "|" | get -o 1 | default "" | str trim } | where {|v| $v != "" } | uniq
}

# Installs exactly `version` (a Debian version) of each package — upgrading or downgrading
# (rollback) — unless that is what is installed. Fails naming the versions on offer when the
# sources do not have it (after one refresh of the package lists).
export def apt-install-exact [version: string, ...packages: string] {
    let wrong = ($packages | where {|p| (installed-version $p) != $version })
    if ($wrong | is-empty) { return }
    for p in $wrong {
        if $version not-in (available-versions $p) {
            apt-retry [update -q]
            let offered = (available-versions $p)
            if $version not-in $offered {
                error make {msg: $"($p) ($version) is not offered by the apt sources of this machine \(offered: ($offered | str join ', ')\)"}
            }
        }
    }
    let policy = "/usr/sbin/policy-rc.d"
    let temporary_policy = (not (has-systemd)) and not ($policy | path exists)
    if $temporary_policy {
        "#!/bin/sh\nexit 101\n" | save --force $policy
        ^chmod 0755 $policy
    }
    try {
        apt-retry ([install -y -q --no-install-recommends --allow-downgrades] | append ($wrong | each {|p| $"($p)=($version)" }))
    } catch {|e|
        if $temporary_policy { rm -f $policy }
        error make {msg: $e.msg}
    }
    if $temporary_policy { rm -f $policy }
}

# Purges packages that are installed (idempotent).
export def apt-purge [...packages: string] {
    let present = ($packages | where {|p| (installed-version $p) != null })
    if ($present | is-empty) { return }
    apt-retry ([purge -y -q] | append $present)
}

# The upstream part of a Debian version: "5:7.0.15-1~deb12u10" -> "7.0.15".
export def upstream-version [debian_version: string]: nothing -> string {
    $debian_version | str replace -r '^[0-9]+:' '' | str replace -r '[-~+].*$' ''
}
