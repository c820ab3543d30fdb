//! `upcloud-double`: the UpCloud API v1.3 test double as a standalone HTTP server, e.g. to
//! try `examples/upcloud` locally (set the account's `endpoint` to the printed address).
//! Prints the endpoint as the first line on stdout, then serves until Ctrl-C or SIGTERM.

use std::io::Write as _;
use std::time::Duration;

use clap::Parser;
use upcloud_double::{DoubleConfig, UpcloudDouble};

#[derive(Parser, Debug)]
#[command(about = "A local test double of UpCloud's REST API v1.3")]
struct Args {
    /// Address to listen on (port 0 picks a free one).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: String,
    /// The API user the double accepts.
    #[arg(long, env = "UPCLOUD_DOUBLE_USERNAME", default_value = "api-user")]
    username: String,
    /// Its password.
    #[arg(long, env = "UPCLOUD_DOUBLE_PASSWORD", default_value = "api-password", hide_env_values = true)]
    password: String,
    /// How long a new server stays in `maintenance`, in milliseconds.
    #[arg(long, default_value_t = 400)]
    create_ms: u64,
    /// How long a stop takes, in milliseconds.
    #[arg(long, default_value_t = 200)]
    stop_ms: u64,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::io::Result<()> {
    let args = Args::parse();
    let config = DoubleConfig {
        username: args.username,
        password: args.password,
        create_time: Duration::from_millis(args.create_ms),
        stop_time: Duration::from_millis(args.stop_ms),
    };
    let double = UpcloudDouble::start_on(&args.listen, config).await?;
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{}", double.endpoint)?;
        out.flush()?;
    }
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    drop(double);
    Ok(())
}
