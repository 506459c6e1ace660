//! Why fencing tokens exist, made concrete (Kleppmann's scenario).
//!
//! Client 1 takes the lock, then pauses (a GC pause, a stopped VM) for longer than its lease.
//! The lock expires and client 2 takes it and writes. Client 1 wakes up still believing it
//! holds the lock and writes too. A storage that remembers the highest token it has seen
//! rejects client 1's late write; without the token check it would silently lose client 2's.
//!
//! `cargo run -p distlock --example fenced_write`

use parking_lot::Mutex;
use std::time::Duration;

use distlock::{FencingToken, LockName, LockOptions};

/// A storage that rejects writes carrying a token lower than one it has already accepted.
#[derive(Default)]
struct FencedStore {
    inner: Mutex<(u64, String)>, // (highest token seen, value)
}

impl FencedStore {
    fn write(&self, token: FencingToken, value: &str) -> Result<(), String> {
        let mut s = self.inner.lock();
        if token.get() < s.0 {
            return Err(format!(
                "rejected {value:?}: token {} is older than {}",
                token.get(),
                s.0
            ));
        }
        *s = (token.get(), value.to_string());
        Ok(())
    }
    fn value(&self) -> String {
        self.inner.lock().1.clone()
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> distlock::Result<()> {
    let locks = distlock::connect("memory://fenced").await?;
    let store = FencedStore::default();
    let name = LockName::new("ledger")?;
    let short = LockOptions::new(Duration::from_millis(200));

    let first = locks.acquire(&name, &short).await?;
    let t1 = first
        .fencing_token()
        .ok_or_else(|| distlock::Error::config("no token"))?;
    println!("client 1 holds the lock with token {}", t1.get());
    println!("client 1 pauses for 500 ms (longer than its 200 ms lease) ...");
    tokio::time::sleep(Duration::from_millis(500)).await;

    let second = locks
        .acquire(&name, &short.clone().wait_for(Duration::from_secs(1)))
        .await?;
    let t2 = second
        .fencing_token()
        .ok_or_else(|| distlock::Error::config("no token"))?;
    println!("client 2 holds the lock with token {}", t2.get());
    store
        .write(t2, "written by client 2")
        .map_err(distlock::Error::config)?;

    // Client 1 resumes. It should have checked `first.state()` — but pauses can strike
    // between the check and the write, so the storage must check the token.
    println!("client 1 resumes; its lease says {:?}", first.state());
    match store.write(t1, "written by client 1 (stale)") {
        Ok(()) => println!("client 1's stale write was accepted: client 2's write is lost!"),
        Err(e) => println!("storage: {e}"),
    }
    println!("final value: {:?}", store.value());
    second.release().await?;
    Ok(())
}
