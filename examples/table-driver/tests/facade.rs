//! A third-party driver plugs into `distlock::connect` with one `register` call.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use distlock::{DistributedLock, LockName, LockOptions};
use table_driver::Table;

#[tokio::test]
async fn registered_scheme_connects_through_the_facade() {
    let table = Table::default();
    let t = table.clone();
    distlock::register("table", move |_url| {
        let lock = t.client();
        async move { Ok(Arc::new(lock) as Arc<dyn DistributedLock>) }
    })
    .unwrap();
    let (a, b) = (
        distlock::connect("table://").await.unwrap(),
        distlock::connect("table://").await.unwrap(),
    );
    assert_eq!(a.backend(), "table");
    let name = LockName::new("facade").unwrap();
    let opts = LockOptions::new(Duration::from_secs(5));
    let lease = a.try_acquire(&name, &opts).await.unwrap().unwrap();
    assert!(b.try_acquire(&name, &opts).await.unwrap().is_none());
    lease.release().await.unwrap();
    assert!(distlock::schemes().contains(&"table".to_string()));
}
