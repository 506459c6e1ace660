//! Two workers share one lock on the embedded in-memory driver; the second waits for the first.
//!
//! `cargo run -p lock-core --example quickstart`

use std::sync::Arc;
use std::time::{Duration, Instant};

use lock_core::{memory::MemoryLock, DistributedLock, LockName, LockOptions};

#[tokio::main(flavor = "current_thread")]
async fn main() -> lock_core::Result<()> {
    // Any driver fits here: Arc<dyn DistributedLock> is the whole contract.
    let locks: Arc<dyn DistributedLock> = Arc::new(MemoryLock::new());
    let name = LockName::new("nightly-report")?;
    let opts = LockOptions::new(Duration::from_secs(5))
        .auto_renew(Some(Duration::from_secs(60)))
        .wait_for(Duration::from_secs(10));
    let start = Instant::now();

    let mut workers = Vec::new();
    for worker in 1..=2 {
        let (locks, name, opts) = (locks.clone(), name.clone(), opts.clone());
        workers.push(tokio::spawn(async move {
            let lease = locks.acquire(&name, &opts).await?;
            let token = lease
                .fencing_token()
                .map_or("none".into(), |t| t.to_string());
            println!(
                "{:>5} ms  worker {worker} holds {name} (fencing token {token})",
                start.elapsed().as_millis()
            );
            tokio::time::sleep(Duration::from_millis(300)).await; // the protected work
            println!(
                "{:>5} ms  worker {worker} releases",
                start.elapsed().as_millis()
            );
            lease.release().await
        }));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for w in workers {
        w.await
            .map_err(|e| lock_core::Error::Config(format!("worker panicked: {e}")))??;
    }
    Ok(())
}
