//! `exec` through the Docker exec API: stdin fed as data, output streamed line by line,
//! exit code from the exec's inspect, timeouts enforced by killing the command's processes.

use std::time::Duration;

use bollard::Docker;
use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use futures::StreamExt;
use tokio::io::AsyncWriteExt;

use super::docker::{classify, status_of};
use crate::output::LineStream;
use crate::{ExecRequest, ExecResult, ProviderError, ProviderResult};

/// Environment variable marking every process of one exec, so a timeout can kill them all
/// (Docker has no API to kill an exec).
pub const EXEC_ID_ENV: &str = "PROVISIONING_EXEC_ID";

/// Kills every process whose environment carries the exec's marker. The marker is passed
/// as `$1`, never spliced into the script.
const KILL_SCRIPT: &str = r#"for p in /proc/[0-9]*; do
  if grep -qxz "PROVISIONING_EXEC_ID=$1" "$p/environ" 2>/dev/null; then kill -KILL "${p#/proc/}" 2>/dev/null; fi
done
exit 0"#;

/// Runs `request` in `container` (id or name).
pub async fn run(docker: &Docker, container: &str, request: ExecRequest) -> ProviderResult<ExecResult> {
    if request.argv.is_empty() {
        return Err(ProviderError::InvalidRequest("exec needs a program to run (argv is empty)".into()));
    }
    if let Some(key) = request.env.keys().find(|k| k.is_empty() || k.contains('=') || k.contains('\0')) {
        return Err(ProviderError::InvalidRequest(format!("invalid environment variable name {key:?}")));
    }
    let marker = uuid::Uuid::new_v4().simple().to_string();
    let mut env: Vec<String> = request.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
    env.push(format!("{EXEC_ID_ENV}={marker}"));
    let deadline = tokio::time::Instant::now() + request.timeout;
    // Bounded per stream (the tail is kept, lines are cut at 64 KiB): see `crate::output`.
    let mut stdout = LineStream::default();
    let mut stderr = LineStream::default();
    let sink = request.output.as_ref();

    let session = async {
        let created = docker
            .create_exec(
                container,
                CreateExecOptions {
                    cmd: Some(request.argv.clone()),
                    env: Some(env),
                    attach_stdin: Some(request.stdin.is_some()),
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    tty: Some(false),
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| exec_error(container, "create exec", e))?;
        let started = docker
            .start_exec(&created.id, Some(StartExecOptions { detach: false, tty: false, output_capacity: None }))
            .await
            .map_err(|e| exec_error(container, "start exec", e))?;
        let StartExecResults::Attached { mut output, mut input } = started else {
            return Err(ProviderError::Permanent("the Docker engine detached an attached exec".into()));
        };
        // Fed from its own task: a command that writes before it reads must not deadlock us.
        let feeder = request.stdin.clone().map(|data| {
            tokio::spawn(async move {
                input.write_all(&data).await?;
                // Half-closing the connection is what makes the engine close the command's stdin.
                input.shutdown().await
            })
        });
        while let Some(item) = output.next().await {
            match item.map_err(|e| ProviderError::Transient(format!("exec output from {container}: {e}")))? {
                LogOutput::StdOut { message } | LogOutput::Console { message } => stdout.push(&message, sink),
                LogOutput::StdErr { message } => stderr.push(&message, sink),
                LogOutput::StdIn { .. } => {}
            }
        }
        if let Some(feeder) = feeder {
            // A command may exit without reading all of its input; that is not our failure.
            match feeder.await {
                Ok(Err(e)) => tracing::debug!(container, error = %e, "stdin not fully consumed"),
                Err(e) => tracing::debug!(container, error = %e, "stdin task ended abnormally"),
                Ok(Ok(())) => {}
            }
        }
        Ok::<String, ProviderError>(created.id)
    };

    let outcome = tokio::time::timeout_at(deadline, session).await;
    let (stdout, stderr) = (stdout.finish(sink), stderr.finish(sink));
    if let Some(sink) = sink {
        sink.finish();
    }
    let exec_id = match outcome {
        Ok(result) => result?,
        Err(_elapsed) => {
            kill(docker, container, &marker).await;
            return Ok(ExecResult { exit_code: None, timed_out: true, stdout, stderr });
        }
    };
    let exit_code = exit_code(docker, &exec_id).await?;
    Ok(ExecResult { exit_code, timed_out: false, stdout, stderr })
}

/// The exit code once the engine has noticed the end of the command (shortly after the
/// output closes).
async fn exit_code(docker: &Docker, exec_id: &str) -> ProviderResult<Option<i64>> {
    let give_up = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let inspect = docker.inspect_exec(exec_id).await.map_err(|e| classify("inspect exec", e))?;
        if inspect.running != Some(true) {
            return Ok(inspect.exit_code);
        }
        if tokio::time::Instant::now() > give_up {
            return Ok(None);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Kills the processes of a timed-out exec (best effort: the result reports the timeout
/// either way).
async fn kill(docker: &Docker, container: &str, marker: &str) {
    let argv = ["/bin/sh", "-c", KILL_SCRIPT, "kill-exec", marker].map(String::from).to_vec();
    let attempt = async {
        let created = docker
            .create_exec(
                container,
                CreateExecOptions { cmd: Some(argv), attach_stdout: Some(true), attach_stderr: Some(true), ..Default::default() },
            )
            .await?;
        if let StartExecResults::Attached { mut output, .. } = docker.start_exec(&created.id, None).await? {
            while output.next().await.is_some() {}
        }
        Ok::<(), bollard::errors::Error>(())
    };
    match tokio::time::timeout(Duration::from_secs(10), attempt).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!(container, error = %e, "could not kill a timed-out exec"),
        Err(_) => tracing::warn!(container, "killing a timed-out exec took too long"),
    }
}

fn exec_error(container: &str, step: &str, e: bollard::errors::Error) -> ProviderError {
    match status_of(&e) {
        Some(404) => ProviderError::NotFound(format!("container {container}")),
        Some(409) => ProviderError::Transient(format!("{step} in {container}: the container is not running ({e})")),
        _ => classify(step, e),
    }
}
