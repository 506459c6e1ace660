//! A small service that hands one lock back and forth between two workers, while a third only
//! tries it, and exports distlock's metrics for Prometheus (every series is named in
//! docs/observability.md).
//!
//! ```sh
//! cargo run -p distlock --features redis --example prometheus -- redis://127.0.0.1:6379 127.0.0.1:9000
//! curl -s http://127.0.0.1:9000/metrics | grep '^lock_'
//! ```
//!
//! `tests/prometheus.rs` scrapes what [`export`] serves after a scripted sequence.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use distlock::{DistributedLock, LockName, LockOptions};
use metrics_exporter_prometheus::PrometheusBuilder;

/// Serves every metric recorded in this process from now on, in Prometheus's text format, on
/// `addr` (any path). Called from a Tokio runtime, which runs the listener.
pub(crate) fn export(addr: SocketAddr) -> Result<(), Box<dyn std::error::Error>> {
    PrometheusBuilder::new()
        .with_http_listener(addr)
        .install()?;
    Ok(())
}

/// Two workers take `name` in turn on `locks` for ever, each holding it for `hold`; a third
/// only tries, and is told it is busy.
pub(crate) async fn serve(locks: Arc<dyn DistributedLock>, hold: Duration) -> distlock::Result<()> {
    let name = LockName::new("example-prometheus")?;
    let opts = LockOptions::new(Duration::from_secs(10)).auto_renew(None);
    let worker = |locks: Arc<dyn DistributedLock>, name: LockName, opts: LockOptions| async move {
        loop {
            let lease = locks.acquire(&name, &opts).await?;
            tokio::time::sleep(hold).await;
            lease.release().await?;
        }
    };
    let try_only = {
        let (locks, name, opts) = (locks.clone(), name.clone(), opts.clone());
        async move {
            loop {
                if let Some(lease) = locks.try_acquire(&name, &opts).await? {
                    lease.release().await?;
                }
                tokio::time::sleep(hold / 2).await;
            }
        }
    };
    tokio::select! {
        r = worker(locks.clone(), name.clone(), opts.clone()) => r,
        r = worker(locks.clone(), name.clone(), opts.clone()) => r,
        r = try_only => r,
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let url = args.next().unwrap_or_else(|| "memory://".into());
    let addr: SocketAddr = args
        .next()
        .unwrap_or_else(|| "127.0.0.1:9000".into())
        .parse()?;
    export(addr)?;
    println!("metrics on http://{addr}/metrics");
    let locks = distlock::connect(&url).await?;
    serve(locks, Duration::from_millis(200)).await?;
    Ok(())
}
