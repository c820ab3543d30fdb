//! The embedded API server alone: `apiserver-standalone --data-dir D [--listen ADDR]`.
//! Used by the crash test (it must be a separate process to be killed with SIGKILL).

use std::net::SocketAddr;
use std::path::PathBuf;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut data_dir: Option<PathBuf> = None;
    let mut listen: SocketAddr = "127.0.0.1:0".parse()?;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--data-dir" => data_dir = args.next().map(PathBuf::from),
            "--listen" => listen = args.next().ok_or_else(|| anyhow::anyhow!("--listen needs a value"))?.parse()?,
            other => anyhow::bail!("unknown argument {other}; usage: apiserver-standalone --data-dir D [--listen ADDR]"),
        }
    }
    let data_dir = data_dir.ok_or_else(|| anyhow::anyhow!("--data-dir is required"))?;
    provisioning_apiserver::run_cli(data_dir, listen).await
}
