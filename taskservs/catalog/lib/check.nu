# Ending a check: the service answered (the caller probed it), now compare the config files
# with what install wrote. Exit codes: 0 healthy, 2 unhealthy (from the caller's `fail`),
# 3 config drift — the result then says `configDrift: true` and names the files, which the
# controller maps to Drifted=True reason ConfigChanged (re-running install converges).

use ctx.nu [emit-result]
use files.nu [config-drift]

# The exit code of a check that found config drift.
export const DRIFT_EXIT = 3

# Emits the check result (`result` plus configDrift/driftedFiles) and exits 3 on drift.
export def finish-check [service: string, result: record] {
    let drift = (config-drift $service)
    if ($drift | is-empty) {
        emit-result ($result | merge {healthy: true, configDrift: false, driftedFiles: []})
        return
    }
    let files = ($drift | get path)
    print --stderr $"ERROR: config drift: ($files | str join ', ') changed since install \(ConfigChanged\)"
    emit-result ($result | merge {healthy: false, configDrift: true, driftedFiles: $files})
    exit $DRIFT_EXIT
}
