//! Runner overhead: what one step costs beyond the script's own work.
//!
//! cargo bench -p provisioning-taskservs --bench runner
//!
//! Measures, with real `nu` processes through `LocalProcessExecutor`:
//! - trivial: a script that only reads its context and emits a result (the whole step);
//! - sleeper: a script that sleeps a known 200 ms; overhead = wall time - 200 ms
//!   (spawn, nu start-up and parsing, context in, result out, runner bookkeeping);
//! - raw: the same trivial nu invocation with std::process (no runner), so
//!   trivial - raw is the runner's own cost on top of nu.
//!
//! The context is realistic: 3 peers and an etcd-sized rendered template plus a 16 KiB one.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use provisioning_taskservs::{LocalProcessExecutor, PeerInfo, ScriptContext, ScriptStep, run_script};

const RUNS: usize = 30;
const SLEEP_MS: u64 = 200;

fn nu() -> PathBuf {
    let path = match std::env::var_os("PROVISIONING_NU") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.tools/bin/nu"),
    };
    assert!(path.is_file(), "nu not found at {}: run scripts/setup.sh", path.display());
    path
}

fn context(ms: u64) -> ScriptContext {
    let mut ctx = ScriptContext::default();
    ctx.server.name = "bench-0".into();
    ctx.taskserv.service = "bench".into();
    ctx.taskserv.version = "1.0".into();
    ctx.peers = (1..=3).map(|i| PeerInfo { name: format!("bench-{i}"), ..Default::default() }).collect();
    ctx.config = serde_json::json!({"ms": ms, "clientPort": 2379});
    ctx.templates.insert("etcd.conf.yml".into(), "name: x\n".repeat(20));
    ctx.templates.insert("big.conf".into(), "# filler line for a bigger context\n".repeat(16 * 1024 / 36));
    ctx
}

struct Stats {
    median: Duration,
    p90: Duration,
    min: Duration,
}

fn stats(mut samples: Vec<Duration>) -> Stats {
    samples.sort();
    Stats { median: samples[samples.len() / 2], p90: samples[samples.len() * 9 / 10], min: samples[0] }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn main() {
    // `cargo bench` passes --bench; a `cargo test` of benches passes nothing useful either.
    let nu = nu();
    let fixtures = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/runner");
    let exec = LocalProcessExecutor::new(nu.to_string_lossy(), fixtures.to_string_lossy());
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    let timeout = Duration::from_secs(30);

    let run = |service: &str, ctx: &ScriptContext| -> Duration {
        let started = Instant::now();
        let outcome = runtime.block_on(run_script(&exec, ScriptStep::Install, service, ctx, timeout, None)).expect("runs");
        let took = started.elapsed();
        assert!(outcome.succeeded() && outcome.result.is_some(), "{outcome:?}");
        took
    };

    let trivial_ctx = context(0);
    let sleeper_ctx = context(SLEEP_MS);
    // Warm-up (page cache, binary load).
    for _ in 0..3 {
        run("trivial", &trivial_ctx);
    }
    let trivial: Vec<Duration> = (0..RUNS).map(|_| run("trivial", &trivial_ctx)).collect();
    let sleeper: Vec<Duration> = (0..RUNS).map(|_| run("sleeper", &sleeper_ctx)).collect();

    let stdin = serde_json::to_vec(&trivial_ctx).expect("json");
    let script = fixtures.join("trivial/install.nu");
    let raw: Vec<Duration> = (0..RUNS)
        .map(|_| {
            let started = Instant::now();
            let mut child = Command::new(&nu)
                .args(["--no-config-file", "--no-std-lib", "--stdin"])
                .arg(&script)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn");
            child.stdin.take().expect("stdin").write_all(&stdin).expect("write");
            let out = child.wait_with_output().expect("wait");
            assert!(out.status.success());
            started.elapsed()
        })
        .collect();

    let context_bytes = stdin.len();
    let t = stats(trivial);
    let s = stats(sleeper);
    let r = stats(raw);
    let sleep = Duration::from_millis(SLEEP_MS);
    println!("runner overhead benchmark: {RUNS} runs each, context {context_bytes} bytes, nu {}", nu.display());
    println!("{:<44} {:>9} {:>9} {:>9}", "case", "median", "p90", "min");
    let row = |name: &str, st: &Stats| println!("{name:<44} {:>7.1}ms {:>7.1}ms {:>7.1}ms", ms(st.median), ms(st.p90), ms(st.min));
    row("trivial step via run_script (whole step)", &t);
    row("raw nu process, same script and stdin", &r);
    row(&format!("sleeper step via run_script ({SLEEP_MS} ms work)"), &s);
    let overhead = Stats { median: s.median.saturating_sub(sleep), p90: s.p90.saturating_sub(sleep), min: s.min.saturating_sub(sleep) };
    row("=> overhead beyond the script's work", &overhead);
    println!("runner's own cost on top of nu (trivial - raw, medians): {:.1} ms", ms(t.median) - ms(r.median));
    let verdict = if overhead.median < Duration::from_millis(50) { "PASS" } else { "FAIL" };
    println!("target: overhead < 50 ms per step: {verdict} ({:.1} ms median)", ms(overhead.median));
}
