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

# An HTTP request with curl; returns `{status: int, body: string}` (status 0 when no answer).
# Credentials go to curl through its config on stdin (`-K -`), never through argv.
export def http-request [url: string, --method: string = "GET", --user: string = "", --password: string = "", --header: string = "", --unix-socket: string = "", --timeout: int = 5]: nothing -> record {
    mut config = [$"url = \"($url)\"" $"request = \"($method)\""]
    if $user != "" {
        let token = ($"($user):($password)" | encode base64)
        $config = ($config | append $"header = \"Authorization: Basic ($token)\"")
    }
    if $header != "" {
        # A header value with quotes or backslashes is escaped for curl's config syntax.
        let escaped = ($header | str replace --all '\' '\\' | str replace --all '"' '\"')
        $config = ($config | append $"header = \"($escaped)\"")
    }
    let socket = if $unix_socket != "" { [--unix-socket $unix_socket] } else { [] }
    let r = ($config | str join "\n" | ^curl -sS --max-time ($timeout | into string) -o - -w "\n%{http_code}" ...$socket -K - | complete)
    let lines = ($r.stdout | lines)
    let status = (try { $lines | last | into int } catch { 0 })
    {status: $status, body: ($lines | drop 1 | str join "\n"), error: ($r.stderr | str trim)}
}
