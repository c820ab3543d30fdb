# Network checks.

# Whether a TCP connection to host:port succeeds (bash's /dev/tcp; host and port are passed as
# arguments, never spliced into the shell text).
export def port-open [host: string, port: int]: nothing -> bool {
    let r = (^timeout 2 bash -c 'exec 3<>"/dev/tcp/$1/$2"' probe $host ($port | into string) | complete)
    $r.exit_code == 0
}

# Waits until host:port accepts connections; fails after `timeout`.
export def wait-port [host: string, port: int, --timeout: duration = 60sec] {
    let deadline = ((date now) + $timeout)
    loop {
        if (port-open $host $port) { return }
        if (date now) > $deadline {
            error make {msg: $"($host):($port) did not accept connections within ($timeout)"}
        }
        sleep 250ms
    }
}

# Retries `check` (a closure returning bool) until it is true; fails after `timeout`.
export def wait-until [what: string, check: closure, --timeout: duration = 60sec, --every: duration = 500ms] {
    let deadline = ((date now) + $timeout)
    loop {
        let ok = (try { do $check } catch { false })
        if $ok { return }
        if (date now) > $deadline {
            error make {msg: $"timed out after ($timeout) waiting for ($what)"}
        }
        sleep $every
    }
}
