//! The same code on any backend: the URL comes from `DISTLOCK_URL` (default `memory://`).
//!
//! ```sh
//! cargo run -p distlock --example swap_backend
//! DISTLOCK_URL=file:///tmp/locks cargo run -p distlock --example swap_backend
//! DISTLOCK_URL=redis://127.0.0.1:6379 cargo run -p distlock --features redis --example swap_backend
//! DISTLOCK_URL=etcd://127.0.0.1:2379 cargo run -p distlock --features etcd --example swap_backend
//! ```

use std::time::Duration;

use distlock::{Fencing, LockName, LockOptions};

#[tokio::main(flavor = "current_thread")]
async fn main() -> distlock::Result<()> {
    if std::env::var_os("DISTLOCK_URL").is_none() {
        std::env::set_var("DISTLOCK_URL", "memory://");
    }
    let locks = distlock::from_env().await?;
    let caps = locks.capabilities();
    println!(
        "backend {}: fencing {:?}, FIFO {}, per-lock TTL {}, minimum TTL {:?}",
        locks.backend(),
        caps.fencing,
        caps.fifo,
        caps.per_lock_ttl,
        caps.min_ttl
    );
    let name = LockName::new("swap-backend-demo")?;
    let ttl = caps.min_ttl.max(Duration::from_secs(2));
    let lease = locks.acquire(&name, &LockOptions::new(ttl)).await?;
    match (caps.fencing, lease.fencing_token()) {
        (Fencing::None, _) => println!("holding {name}; this backend gives no fencing token"),
        (_, token) => println!(
            "holding {name} with fencing token {:?}",
            token.map(|t| t.get())
        ),
    }
    println!(
        "valid for {:?} more",
        lease.valid_until() - std::time::Instant::now()
    );
    lease.release().await?;
    println!("released");
    Ok(())
}
