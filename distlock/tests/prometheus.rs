//! The Prometheus example's endpoint, scraped over HTTP after a scripted sequence on
//! PostgreSQL — a grant, a busy try, a wait that times out, and a lease lost by a connection
//! cut at the fault proxy — shows each metric of docs/observability.md with its labels and
//! the count of what happened.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure report

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use conformance_tests::FaultProxy;
use distlock::{Error, LockName, LockOptions};
use test_support::servers;

#[path = "../examples/prometheus.rs"]
#[allow(dead_code)] // its `main` and `serve` are the example's, not this test's
mod example;

/// A loopback address nobody listens on, from the test ports' band (no outgoing connection
/// takes it before the exporter binds it).
fn free_addr() -> SocketAddr {
    test_support::loopback(test_support::ports::free_ports(1).numbers()[0])
}

/// GET / on `addr`: the body.
fn scrape(addr: SocketAddr) -> String {
    let mut s = TcpStream::connect(addr).expect("the exporter listens");
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out.split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or(out)
}

/// The value of the sample of `metric` (its name as Prometheus writes it, without suffix
/// variants) that has every label of `labels`, if one does.
fn sample(body: &str, metric: &str, labels: &[(&str, &str)]) -> Option<f64> {
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.split(['{', ' '])
                .next()
                .is_some_and(|n| n == metric || n == format!("{metric}_total"))
        })
        .find(|l| {
            labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_exports_each_metric_with_its_labels_after_a_scripted_sequence() {
    let addr = free_addr();
    example::export(addr).unwrap();
    let pg = servers::server("pg").socket();
    let proxy = FaultProxy::start(pg).unwrap();
    let through = format!(
        "postgres://locker@{}/postgres?sslmode=disable&session_timeout_ms=2000",
        proxy.addr()
    );
    let direct = servers::url("postgres://locker@{pg}/postgres?sslmode=disable");
    let holder = distlock::connect(&through).await.unwrap();
    let other = distlock::connect(&direct).await.unwrap();
    let name = LockName::new(format!("prometheus-{}", std::process::id())).unwrap();
    let opts = LockOptions::new(Duration::from_secs(10)).auto_renew(None);

    let lease = holder
        .try_acquire(&name, &opts)
        .await
        .unwrap()
        .expect("a grant");
    assert!(
        other.try_acquire(&name, &opts).await.unwrap().is_none(),
        "a busy try"
    );
    let waited = other
        .acquire(&name, &opts.clone().wait_for(Duration::from_millis(200)))
        .await;
    assert!(matches!(waited, Err(Error::Timeout { .. })), "{waited:?}");
    proxy.cut();
    tokio::time::timeout(Duration::from_secs(5), lease.lost().wait())
        .await
        .expect("the lease is lost when its session's connection is cut");

    let pg = ("lock_backend", "postgres");
    let expect = |body: &str, metric: &str, labels: &[(&str, &str)], want: f64| {
        let got = sample(body, metric, labels);
        assert_eq!(
            got,
            Some(want),
            "{metric} {labels:?} in the scrape:\n{}",
            body.lines()
                .filter(|l| l.starts_with("lock_"))
                .collect::<Vec<_>>()
                .join("\n")
        );
    };
    // The loss is reported as the signal fires; give the scrape a moment to see it.
    let mut body = scrape(addr);
    for _ in 0..50 {
        if sample(&body, "lock_lost", &[pg]).is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        body = scrape(addr);
    }
    let try_ = ("lock_attempt", "try");
    let wait = ("lock_attempt", "wait");
    let excl = ("lock_mode", "exclusive");
    expect(
        &body,
        "lock_acquisitions",
        &[pg, excl, try_, ("lock_outcome", "granted")],
        1.0,
    );
    expect(
        &body,
        "lock_acquisitions",
        &[pg, excl, try_, ("lock_outcome", "busy")],
        1.0,
    );
    expect(
        &body,
        "lock_acquisitions",
        &[pg, excl, wait, ("lock_outcome", "timeout")],
        1.0,
    );
    expect(
        &body,
        "lock_acquire_duration_count",
        &[pg, wait, ("lock_outcome", "timeout")],
        1.0,
    );
    expect(
        &body,
        "lock_lost",
        &[pg, ("lock_loss_reason", "connection_closed")],
        1.0,
    );
    expect(
        &body,
        "lock_hold_duration_count",
        &[pg, ("lock_end", "lost")],
        1.0,
    );
    expect(&body, "lock_held", &[pg], 0.0);
    expect(&body, "lock_waiting", &[pg], 0.0);
    assert!(
        !body.contains(name.as_str()),
        "the lock name is not a label unless asked for"
    );
    let _ = lease.release().await;
}
