//! Two workers share one lock through the facade; the second waits for the first.
//!
//! `cargo run -p distlock --example quickstart`

use std::time::{Duration, Instant};

use distlock::{LockExt, LockName, LockOptions, StopOn};

#[tokio::main(flavor = "current_thread")]
async fn main() -> distlock::Result<()> {
    // Any URL works here; memory:// needs no server.
    let locks = distlock::connect("memory://quickstart").await?;
    let name = LockName::new("nightly-report")?;
    let opts = LockOptions::new(Duration::from_secs(5))
        .auto_renew(Some(Duration::from_secs(60)))
        .wait_for(Duration::from_secs(10));
    let start = Instant::now();
    let mut workers = Vec::new();
    for worker in 1..=2 {
        let (locks, name, opts) = (locks.clone(), name.clone(), opts.clone());
        workers.push(tokio::spawn(async move {
            // Held while the work runs, released at its end; the work is stopped, and
            // Err(Lost) returned, if the lease is lost before it ends.
            locks
                .with_lock(&name, &opts, StopOn::Lost, |scope| async move {
                    println!(
                        "{:>5} ms  worker {worker} holds {}, fencing token {:?}",
                        start.elapsed().as_millis(),
                        scope.name(),
                        scope.fencing_token().map(|t| t.get())
                    );
                    tokio::time::sleep(Duration::from_millis(300)).await; // the protected work
                    println!(
                        "{:>5} ms  worker {worker} is done",
                        start.elapsed().as_millis()
                    );
                })
                .await
        }));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for w in workers {
        w.await
            .map_err(|e| distlock::Error::config(format!("worker panicked: {e}")))??;
    }
    Ok(())
}
