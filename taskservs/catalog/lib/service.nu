# Starting and stopping daemons, with systemd (cloud machines) or without (containers: no
# systemd, so daemons run in their own session with a pid file under /run/provisioning and a
# log under /var/log/provisioning).

use pkg.nu [has-systemd]

const PID_DIR = "/run/provisioning"
const LOG_DIR = "/var/log/provisioning"

# The pid file of a daemon started by `svc-start`.
export def pid-file [name: string]: nothing -> string {
    $"($PID_DIR)/($name).pid"
}

# The log file of a daemon started by `svc-start` (no systemd).
export def log-file [name: string]: nothing -> string {
    $"($LOG_DIR)/($name).log"
}

def pid-of [name: string]: nothing -> any {
    let file = (pid-file $name)
    if not ($file | path exists) { return null }
    let pid = (open --raw $file | decode utf-8 | str trim)
    if ($pid =~ '^[0-9]+$') and ($"/proc/($pid)" | path exists) {
        # A zombie or a recycled pid is not our daemon; one that exited since the check above
        # has no stat any more.
        let state = (try { open --raw $"/proc/($pid)/stat" | decode utf-8 | split row " " | get 2 } catch { "gone" })
        if $state in ["Z", "gone"] { null } else { $pid | into int }
    } else {
        null
    }
}

# Whether the daemon runs: `systemctl is-active <unit>` with systemd, else its pid file.
export def svc-running [name: string, --unit: string = ""]: nothing -> bool {
    if (has-systemd) and ($unit != "") {
        (^systemctl is-active --quiet $unit | complete | get exit_code) == 0
    } else {
        (pid-of $name) != null
    }
}

# Starts a daemon unless it runs. With systemd and a `--unit`: `systemctl enable` and
# `restart` (when `--restart`) or `start`. Without: runs `argv` (in the foreground mode of the
# daemon) detached with setsid, as `--user` when given, output to the log file.
export def svc-start [name: string, argv: list<string> = [], --unit: string = "", --user: string = "", --restart] {
    if (has-systemd) and ($unit != "") {
        ^systemctl daemon-reload
        ^systemctl enable $unit
        if $restart { ^systemctl restart $unit } else { ^systemctl start $unit }
        return
    }
    if (svc-running $name) {
        if not $restart { return }
        svc-stop $name
    }
    if ($argv | is-empty) { error make {msg: $"svc-start ($name): no command to run"} }
    mkdir $PID_DIR $LOG_DIR
    let log = (log-file $name)
    let command = if $user != "" {
        let gid = (^id -g $user | str trim)
        ["setpriv" $"--reuid=($user)" $"--regid=($gid)" "--init-groups" "--"] | append $argv
    } else {
        $argv
    }
    # The shell only backgrounds and reports the pid; the command arrives as "$@" (data).
    let pid = (^sh -c 'log="$1"; shift; setsid "$@" </dev/null >>"$log" 2>&1 & echo $!' svc-start $log ...$command | str trim)
    $pid | save --force (pid-file $name)
    sleep 200ms
    if (pid-of $name) == null {
        let tail = (try { open --raw $log | decode utf-8 | lines | last 20 | str join "\n" } catch { "" })
        error make {msg: $"($name) exited right after start; log tail:\n($tail)"}
    }
}

# Stops a daemon (idempotent): systemctl with systemd, else SIGTERM, then SIGKILL after `--grace`.
export def svc-stop [name: string, --unit: string = "", --grace: duration = 10sec] {
    if (has-systemd) and ($unit != "") {
        ^systemctl disable --now $unit | complete | ignore
        return
    }
    let pid = (pid-of $name)
    if $pid != null {
        ^kill -TERM $pid | complete | ignore
        let deadline = ((date now) + $grace)
        while (not (exited $pid)) and ((date now) < $deadline) { sleep 100ms }
        if not (exited $pid) {
            ^kill -KILL $pid | complete | ignore
            let deadline = ((date now) + 5sec)
            while (not (exited $pid)) and ((date now) < $deadline) { sleep 100ms }
        }
    }
    rm -f (pid-file $name)
}

# Whether every thread of process `pid` has exited, so its sockets and files are closed: a
# multi-threaded daemon's main thread can be a zombie while its other threads still hold the
# listening socket (a restart then fails with "address already in use").
def exited [pid: int]: nothing -> bool {
    let tasks = (try { ls $"/proc/($pid)/task" | get name | path basename } catch { [] })
    $tasks | all {|task|
        let state = (try { open --raw $"/proc/($pid)/task/($task)/stat" | decode utf-8 | split row ") " | last | split row " " | get 0 } catch { "gone" })
        $state in ["Z", "X", "gone"]
    }
}

# The ARGS of a Debian /etc/default/<name> file (`ARGS="--a=1 --b"`) as argv words: the
# file the package's systemd unit reads is the one the detached daemon is started with, so
# both run the same flags. Our templates write values without spaces or quotes.
export def default-args [path: string]: nothing -> list<string> {
    let line = (open --raw $path | decode utf-8 | lines | where {|l| $l starts-with "ARGS=" } | get -o 0 | default 'ARGS=""')
    $line | str replace -r '^ARGS="?' '' | str replace -r '"$' '' | split row " " | where {|w| $w != "" }
}
