//! The fault proxy on its own, in front of a loopback echo server.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure report

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use conformance_tests::FaultProxy;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

async fn echo_server() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    addr
}

async fn roundtrip(s: &mut TcpStream, msg: &[u8]) -> std::io::Result<Vec<u8>> {
    s.write_all(msg).await?;
    let mut buf = vec![0u8; msg.len()];
    s.read_exact(&mut buf).await?;
    Ok(buf)
}

#[tokio::test]
async fn passes_data_through_and_counts_it() {
    let proxy = FaultProxy::start(echo_server().await).unwrap();
    let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
    assert_eq!(roundtrip(&mut s, b"hello").await.unwrap(), b"hello");
    assert_eq!(proxy.bytes_to_upstream(), 5);
    assert_eq!(proxy.connections(), 1);
}

/// A proxied connection to the echo server, warmed by one round trip, then delayed by `d`.
async fn delayed_by(d: Duration) -> (FaultProxy, TcpStream) {
    let proxy = FaultProxy::start(echo_server().await).unwrap();
    let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
    roundtrip(&mut s, b"warm").await.unwrap();
    proxy.delay(d);
    (proxy, s)
}

#[tokio::test]
async fn delay_slows_each_direction() {
    let (proxy, mut s) = delayed_by(Duration::from_millis(100)).await;
    let start = Instant::now();
    roundtrip(&mut s, b"slow").await.unwrap();
    assert!(
        start.elapsed() >= Duration::from_millis(200),
        "{:?}",
        start.elapsed()
    );
    proxy.heal();
    let start = Instant::now();
    roundtrip(&mut s, b"fast").await.unwrap();
    assert!(
        start.elapsed() < Duration::from_millis(100),
        "{:?}",
        start.elapsed()
    );
}

/// A delay is latency: two requests sent back to back come back one round trip later, not
/// one delay after another (which would make a pipelined request look twice as slow). Judged
/// by the gap between the two answers, not by a bound on the total, which a loaded machine
/// stretched (a 300 ms bound failed once at load 18, at 360 ms): the second answer follows
/// the first by the fifth of a delay it was sent after; a queue would hold it a whole delay
/// behind (the first's delay, each way, before its own).
#[tokio::test]
async fn delay_is_latency_not_a_queue() {
    let d = Duration::from_millis(200);
    let (_proxy, mut s) = delayed_by(d).await;
    let start = Instant::now();
    s.write_all(b"one").await.unwrap();
    tokio::time::sleep(d / 5).await;
    s.write_all(b"two").await.unwrap();
    let mut buf = [0u8; 6];
    let (mut got, mut first_back) = (0, None);
    while got < 6 {
        got += s.read(&mut buf[got..]).await.unwrap();
        if got >= 3 && first_back.is_none() {
            first_back = Some(start.elapsed());
        }
    }
    let (first, second) = (first_back.unwrap_or_default(), start.elapsed());
    assert_eq!(&buf, b"onetwo");
    assert!(
        first >= 2 * d,
        "the first request came back {first:?} after it was sent, through a {d:?} delay each \
         way: less than its round trip"
    );
    assert!(
        second - first < d * 3 / 4,
        "the second request came back {:?} after the first (sent {:?} after it), through a \
         {d:?} delay: it waited behind the first one's delay, a queue, not latency",
        second - first,
        d / 5
    );
}

/// A delay is the same for every chunk: one sent while an earlier one is still on its way
/// arrives the whole delay late too, not with the earlier one (which would make the latency
/// anything between none and the delay, depending on what else was on the link).
#[tokio::test]
async fn every_chunk_arrives_the_whole_delay_late() {
    let d = Duration::from_millis(100);
    let (_proxy, mut s) = delayed_by(d).await;
    s.write_all(b"one").await.unwrap();
    tokio::time::sleep(d / 2).await;
    let second_sent = Instant::now();
    s.write_all(b"two").await.unwrap();
    let mut buf = [0u8; 6];
    let mut got = 0;
    while got < 6 {
        got += s.read(&mut buf[got..]).await.unwrap();
    }
    let took = second_sent.elapsed();
    assert_eq!(&buf, b"onetwo");
    assert!(
        took >= 2 * d,
        "a chunk sent {:?} after another came back {took:?} after it was sent, through a \
         {d:?} delay each way: it travelled with the earlier chunk instead of taking the \
         round trip of its own ({:?})",
        d / 2,
        2 * d
    );
}

#[tokio::test]
async fn blackhole_holds_data_until_heal() {
    let proxy = FaultProxy::start(echo_server().await).unwrap();
    let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
    roundtrip(&mut s, b"a").await.unwrap();
    proxy.blackhole();
    let r = tokio::time::timeout(Duration::from_millis(300), roundtrip(&mut s, b"b")).await;
    assert!(r.is_err(), "data crossed a blackhole");
    // A new connection reaches nobody either.
    let mut s2 = TcpStream::connect(proxy.addr()).await.unwrap();
    let r2 = tokio::time::timeout(Duration::from_millis(200), roundtrip(&mut s2, b"c")).await;
    assert!(r2.is_err(), "a new connection crossed a blackhole");
    proxy.heal();
    let mut buf = [0u8; 1];
    tokio::time::timeout(Duration::from_secs(2), s.read_exact(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&buf, b"b", "held-back bytes must flow after heal");
    tokio::time::timeout(Duration::from_secs(2), s2.read_exact(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&buf, b"c");
}

#[tokio::test]
async fn cut_drops_connections_but_accepts_new_ones() {
    let proxy = FaultProxy::start(echo_server().await).unwrap();
    let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
    roundtrip(&mut s, b"x").await.unwrap();
    proxy.cut();
    let mut buf = [0u8; 1];
    let r = tokio::time::timeout(Duration::from_secs(2), s.read(&mut buf))
        .await
        .unwrap();
    assert!(
        matches!(r, Ok(0) | Err(_)),
        "connection survived a cut: {r:?}"
    );
    let mut s2 = TcpStream::connect(proxy.addr()).await.unwrap();
    assert_eq!(roundtrip(&mut s2, b"y").await.unwrap(), b"y");
}

#[tokio::test]
async fn drop_stops_the_proxy() {
    let proxy = FaultProxy::start(echo_server().await).unwrap();
    let addr = proxy.addr();
    drop(proxy);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        TcpStream::connect(addr).await.is_err(),
        "proxy still listening after drop"
    );
}

/// A witness sees a cut, as soon as a client of the proxy does; without a cut it sees nothing
/// (its thread gives up after a second), and a blackhole is not a cut. A witness that were
/// armed before the proxy held its connection would miss the cut: armed means held.
#[tokio::test]
async fn a_witness_sees_a_cut_and_nothing_else() {
    let proxy = FaultProxy::start(echo_server().await).unwrap();
    let mut client = TcpStream::connect(proxy.addr()).await.unwrap();
    roundtrip(&mut client, b"warm").await.unwrap();
    for round in 0..20 {
        let mut witness = proxy.witness();
        assert!(witness.armed().await, "round {round}: witness not armed");
        let cut = std::time::Instant::now();
        proxy.cut();
        let seen = witness.seen().await.expect("the witness saw no cut");
        assert!(seen >= cut, "round {round}: seen before the cut");
        assert!(
            seen - cut < Duration::from_millis(900),
            "round {round}: seen {:?} after the cut",
            seen - cut
        );
    }
    let mut client_read = [0u8; 1];
    assert_eq!(
        client.read(&mut client_read).await.unwrap_or(0),
        0,
        "cut too"
    );
    let mut quiet = proxy.witness();
    assert!(quiet.armed().await);
    proxy.blackhole();
    assert_eq!(quiet.seen().await, None, "no cut, nothing seen");
    proxy.heal();
}

/// A witness sees a cut only once the proxy has closed every other connection: the moment it
/// gives is when the whole cut was made, not its first close. Its connection is the oldest, so
/// without that order it would be closed first, while 200 others are still open. A witness
/// waits a second for its cut once armed: a round whose 200 connections took longer to open
/// (a loaded machine) is tried again, and three rounds must complete.
#[tokio::test]
async fn a_witness_sees_a_cut_after_every_other_connection_closed() {
    let proxy = FaultProxy::start(echo_server().await).unwrap();
    let (mut done, mut tries) = (0, 0);
    while done < 3 {
        tries += 1;
        assert!(
            tries <= 30,
            "only {done} of 30 rounds opened 200 connections within 700 ms"
        );
        let mut witness = proxy.witness();
        assert!(witness.armed().await, "round {tries}: witness not armed");
        let armed = std::time::Instant::now();
        let mut opening = tokio::task::JoinSet::new();
        for _ in 0..200 {
            let addr = proxy.addr();
            opening.spawn(async move {
                let mut c = TcpStream::connect(addr).await.ok()?;
                roundtrip(&mut c, b"held").await.ok()?;
                Some(c)
            });
        }
        let clients: Vec<TcpStream> = opening.join_all().await.into_iter().flatten().collect();
        let opened = clients.len();
        if armed.elapsed() > Duration::from_millis(700) || opened < 200 {
            proxy.cut(); // this witness's second may be up: start again
            let _ = witness.seen().await;
            continue;
        }
        proxy.cut();
        witness.seen().await.expect("the witness saw no cut");
        assert_eq!(
            proxy.open_connections(),
            0,
            "round {tries}: connections still open when the witness saw the cut"
        );
        done += 1;
    }
}

/// `first_sent_since` is when the proxy read a client's first bytes at or after the instant
/// asked about (before the delay, not when it forwarded them), and nothing when none came.
#[tokio::test]
async fn first_sent_since_is_when_the_first_client_bytes_arrived() {
    let (proxy, mut s) = delayed_by(Duration::from_millis(100)).await;
    let before = Instant::now();
    assert_eq!(proxy.first_sent_since(before), None, "nothing sent yet");
    tokio::time::sleep(Duration::from_millis(30)).await;
    let writing = Instant::now();
    roundtrip(&mut s, b"one").await.unwrap();
    let replied = Instant::now();
    roundtrip(&mut s, b"two").await.unwrap();
    let sent = proxy
        .first_sent_since(before)
        .expect("the first request is recorded");
    assert!(
        sent >= writing && sent + Duration::from_millis(150) < replied,
        "the first request's arrival, not the second's nor its forwarding: {:?} after writing, \
         {:?} before its reply",
        sent - writing,
        replied.saturating_duration_since(sent)
    );
    let second = proxy.first_sent_since(replied).expect("the second request");
    assert!(
        second >= replied,
        "a chunk from before the instant asked about"
    );
    assert_eq!(proxy.first_sent_since(Instant::now()), None);
}

/// Over several proxies (`Link` for `Vec<FaultProxy>`), the first request since the instant
/// is the earliest that any of them read.
#[tokio::test]
async fn first_sent_since_over_proxies_is_the_earliest() {
    use conformance_tests::Link;
    let server = echo_server().await;
    let proxies = vec![
        FaultProxy::start(server).unwrap(),
        FaultProxy::start(server).unwrap(),
    ];
    let mut a = TcpStream::connect(proxies[0].addr()).await.unwrap();
    let mut b = TcpStream::connect(proxies[1].addr()).await.unwrap();
    let before = Instant::now();
    roundtrip(&mut b, b"first").await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    roundtrip(&mut a, b"later").await.unwrap();
    let earliest = proxies.first_sent_since(before);
    assert_eq!(earliest, proxies[1].first_sent_since(before));
    assert!(earliest < proxies[0].first_sent_since(before));
}
