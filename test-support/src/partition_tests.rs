//! [`Faults`]: overlapping faults on a cluster's links, seen through real proxies.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure report

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use super::*;

/// Links between three members, every one to a loopback echo server.
struct Three(Parts);

#[async_trait]
impl Cluster for Three {
    fn parts(&self) -> &Parts {
        &self.0
    }
    async fn agreed_leader(&self) -> Option<usize> {
        None
    }
    async fn client(&self, _: usize) -> lock_core::Result<Arc<dyn DistributedLock>> {
        Err(lock_core::Error::config("no clients here"))
    }
}

fn three() -> Three {
    let echo = TcpListener::bind("127.0.0.1:0").unwrap();
    let upstream = echo.local_addr().unwrap();
    std::thread::spawn(move || {
        for s in echo.incoming().flatten() {
            std::thread::spawn(move || {
                let (mut r, mut w) = (s.try_clone().unwrap(), s);
                let _ = std::io::copy(&mut r, &mut w);
            });
        }
    });
    let mut links = Vec::new();
    for from in 0..3 {
        for to in (0..3).filter(|t| *t != from) {
            let proxy = FaultProxy::start(upstream).unwrap();
            links.push(Link {
                from: Some(from),
                to,
                proxy,
            });
        }
    }
    let parts = Parts::new(Members::default(), vec![], links, crate::scratch("faults"));
    Three(parts)
}

/// Whether a byte sent from `from` to `to` comes back within 300 ms.
fn passes(c: &Three, from: usize, to: usize) -> bool {
    let link =
        c.0.links
            .iter()
            .find(|l| l.from == Some(from) && l.to == to);
    let mut s = TcpStream::connect(link.unwrap().proxy.addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    s.write_all(b"x").unwrap();
    let mut b = [0u8; 1];
    matches!(s.read(&mut b), Ok(1))
}

#[test]
fn a_healed_fault_leaves_the_links_another_fault_still_cuts() {
    let c = three();
    let faults = Faults::default();
    faults.set(&c, Fault::Isolate, 0, true);
    faults.set(&c, Fault::Mute, 1, true);
    assert!(!passes(&c, 0, 1) && !passes(&c, 2, 0) && !passes(&c, 2, 1));
    assert!(passes(&c, 1, 2), "member 1 dials out while muted");
    // Member 0 rejoins; member 1 is still muted, so 0 cannot dial it.
    faults.set(&c, Fault::Isolate, 0, false);
    assert!(
        !passes(&c, 0, 1),
        "healing the isolation of member 0 healed the link to member 1, which is still muted"
    );
    assert!(passes(&c, 2, 0) && passes(&c, 0, 2) && passes(&c, 1, 0));
    faults.set(&c, Fault::Mute, 1, false);
    assert!(passes(&c, 0, 1) && passes(&c, 2, 1));
}

#[test]
fn two_faults_on_one_member_heal_one_at_a_time() {
    let c = three();
    let faults = Faults::default();
    faults.set(&c, Fault::Between(2), 0, true);
    faults.set(&c, Fault::Isolate, 0, true);
    faults.set(&c, Fault::Isolate, 0, false);
    assert!(
        !passes(&c, 0, 2) && !passes(&c, 2, 0),
        "the bridge was healed with the isolation"
    );
    assert!(passes(&c, 0, 1) && passes(&c, 1, 0));
    faults.set(&c, Fault::Between(2), 0, false);
    assert!(passes(&c, 0, 2) && passes(&c, 2, 0));
}

/// A failed run's report carries each server's last lines, and only `*.log` files.
#[test]
fn log_tails_gives_each_logs_last_lines_by_path() {
    let dir = crate::scratch("distlock-log-tails-");
    std::fs::create_dir_all(dir.join("s0")).unwrap();
    std::fs::write(dir.join("s0/server.log"), "one\ntwo\nthree\n").unwrap();
    std::fs::write(dir.join("out.log"), "only\n").unwrap();
    std::fs::write(dir.join("s0/zoo.cfg"), "not a log\n").unwrap();
    let tails = log_tails(&dir, 2);
    let out = format!(
        "--- the last 2 lines of {}\nonly\n",
        dir.join("out.log").display()
    );
    let server = format!(
        "--- the last 2 lines of {}\ntwo\nthree\n",
        dir.join("s0/server.log").display()
    );
    assert_eq!(tails, format!("{out}{server}"));
}

/// A member that exited (its port taken, say) is named at once, with the logs, not after a
/// minute's wait for a leader; one that runs is not.
#[test]
#[should_panic(expected = "members [1] of the test's cluster exited before it agreed on a leader")]
fn a_member_that_exited_fails_the_wait_for_a_leader_at_once() {
    let spawn = |cmd: &str, arg: &str| std::process::Command::new(cmd).arg(arg).spawn().unwrap();
    let members = Members(vec![spawn("sleep", "30"), spawn("true", "")]);
    let started = std::time::Instant::now();
    while members.exited() != vec![1] {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "`true` never exited"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let dir = crate::scratch("distlock-exited-");
    let three = Three(Parts::new(members, Vec::new(), Vec::new(), dir));
    let rt = tokio::runtime::Runtime::new().unwrap();
    let started = std::time::Instant::now();
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        rt.block_on(three.leader());
    }))
    .map_err(|e| {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "named only after the wait"
        );
        std::panic::resume_unwind(e)
    });
}
