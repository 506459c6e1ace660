//! A third-party driver plugs into `distlock::connect` with one `register_driver` call.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use distlock::{LockName, LockOptions};

#[tokio::test]
async fn registered_driver_connects_through_the_facade() {
    distlock::register_driver(table_driver::DRIVER).unwrap();
    let (a, b) = (
        distlock::connect("table://facade").await.unwrap(),
        distlock::connect("table://facade").await.unwrap(),
    );
    assert_eq!(a.backend(), "table");
    let name = LockName::new("facade").unwrap();
    let opts = LockOptions::new(Duration::from_secs(5));
    let lease = a.try_acquire(&name, &opts).await.unwrap().unwrap();
    assert!(b.try_acquire(&name, &opts).await.unwrap().is_none());
    lease.release().await.unwrap();
    assert!(distlock::schemes().contains(&"table".to_string()));
    // Another table name is another "server".
    let other = distlock::connect("table://elsewhere").await.unwrap();
    assert!(other.try_acquire(&name, &opts).await.unwrap().is_some());
    assert!(distlock::connect("table://a/b").await.is_err());
}
