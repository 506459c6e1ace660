//! The report's own tests: the figures and the evidence of small hand-made histories.

use super::*;
use crate::safety::checker::{check, Rules};

/// Two overlapping holders with a fault between: the evidence shows both clients'
/// acquisitions and grants, the fault, and how the runtime polled the second grant —
/// and nothing of a third client.
#[test]
fn evidence_shows_the_clients_involved_and_the_faults() {
    let t0 = Instant::now();
    let ms = |m: u64| t0 + Duration::from_millis(m);
    let ev = |m: u64, client: usize, op: Op| Event {
        at: ms(m),
        client,
        name: 0,
        op,
    };
    let fault = |what: &str| Op::Fault { what: what.into() };
    let heal = |what: &str| Op::Heal { what: what.into() };
    let events = vec![
        ev(0, NOBODY, fault("pause client 3")),
        ev(0, NOBODY, heal("pause client 3")),
        ev(0, NOBODY, fault("freeze server zk-ens1 for 2s")),
        ev(5, 0, Op::Acquire),
        ev(
            10,
            0,
            Op::Granted {
                lease: 1,
                token: Some(1),
                valid_until: ms(1000),
            },
        ),
        ev(15, 2, Op::Acquire),
        ev(
            20,
            NOBODY,
            Op::Fault {
                what: "freeze zk-ens1".into(),
            },
        ),
        ev(30, 1, Op::Acquire),
        ev(
            40,
            1,
            Op::Granted {
                lease: 2,
                token: Some(2),
                valid_until: ms(1040),
            },
        ),
        ev(
            40,
            1,
            Op::Polled {
                lease: 2,
                woken: Some(ms(35)),
                polled: Some(ms(39)),
            },
        ),
    ];
    let report = checked(events, true, Duration::from_secs(5), ms(2000));
    let first = report.violations.first().expect("an overlap");
    let text = report.evidence(first);
    assert_shows(
        &text,
        &[
            "0.0050 client 0 name 0: Acquire",
            "nemesis: Fault { what: \"freeze server zk-ens1 for 2s\" }",
            "0.0100 client 0 name 0: granted lease 1 (token Some(1)), valid until 1.0000",
            "0.0200 nemesis: Fault",
            "0.0400 client 1 name 0: granted lease 2",
            "last woken at 0.0350, last polled at 0.0390",
        ],
        &["client 2", "pause"], // an uninvolved client, a fault healed before
    );
    let Err(failure) = report.verdict() else {
        panic!("an overlap passed the verdict");
    };
    assert!(failure.to_string().contains(&text), "{failure}");
    assert!(
        (failure.to_string()).contains("monotonic clock: no step over 1 ms"),
        "{failure}"
    );
    // A forward step of the wall clock during the run is named, when and how far, beside
    // the violation it may explain (servers that expire keys by it drop them early).
    let mut stepped = report;
    stepped.clock_steps = vec![crate::safety::ClockStep {
        at: ms(25),
        by_ns: 250_000_000,
    }];
    let Err(failure) = stepped.verdict() else {
        panic!("an overlap passed the verdict");
    };
    assert!(
        (failure.to_string()).contains("1 step(s): +250.000 ms at 0.025 s"),
        "{failure}"
    );
    assert!(stepped.summary().contains("wall clock steps 1 step(s)"));
}

/// An overlap followed by a busy client's hundred events within the window after it: the
/// evidence still shows the fault and the grant that made the overlap, not only what followed
/// (a failed Redlock soak's report once showed 60 lines after the violation and none before).
#[test]
fn evidence_of_an_overlap_shows_what_led_to_it_before_what_followed() {
    let t0 = Instant::now();
    let us = |u: u64| t0 + Duration::from_micros(u);
    let ev = |u: u64, client: usize, name: usize, op: Op| Event {
        at: us(u),
        client,
        name,
        op,
    };
    let granted = |lease, u| Op::Granted {
        lease,
        token: None,
        valid_until: us(u),
    };
    let mut events = vec![
        ev(0, 0, 0, Op::Acquire),
        ev(10, 0, 0, granted(1, 900_000)),
        ev(
            20_000,
            NOBODY,
            NOBODY,
            Op::Fault {
                what: "freeze server redlock2 for 400ms".into(),
            },
        ),
        ev(30_000, 1, 0, Op::Acquire),
        ev(40_000, 1, 0, granted(2, 900_000)),
    ];
    // Client 1 goes on with other names, 100 times in the next 90 ms.
    for i in 0..50u64 {
        let lease = 10 + i;
        events.push(ev(41_000 + i * 1_800, 1, 1, Op::Acquire));
        events.push(ev(41_500 + i * 1_800, 1, 1, granted(lease, 2_000_000)));
    }
    let report = checked(events, false, Duration::from_secs(5), us(2_000_000));
    let first = report.violations.first().expect("an overlap");
    let text = report.evidence(first);
    assert_shows(
        &text,
        &[
            "freeze server redlock2",
            "0.0400 client 1 name 0: granted lease 2",
            "client 1 name 1: granted lease 10",
        ],
        &[],
    );
    assert!(text.lines().count() <= 63, "too long:\n{text}");
}

/// A name not granted again after the last heal: the evidence shows what happened on that
/// name since its last grant (the holder that never let go, the waiter refused) and the
/// heal, and nothing of another name.
#[test]
fn evidence_of_a_stuck_name_shows_that_name_since_its_last_grant() {
    let t0 = Instant::now();
    let ms = |m: u64| t0 + Duration::from_millis(m);
    let ev = |m: u64, client: usize, name: usize, op: Op| Event {
        at: ms(m),
        client,
        name,
        op,
    };
    let granted = |lease| Op::Granted {
        lease,
        token: None,
        valid_until: ms(5000),
    };
    let refused = Op::Refused {
        error: "timed out".into(),
        timed_out: true,
    };
    let events = vec![
        ev(0, 0, 1, Op::Acquire),
        ev(10, 0, 1, granted(1)),
        ev(20, 0, 1, Op::Release { lease: 1 }),
        ev(30, 1, 1, Op::Acquire),
        ev(40, 1, 1, granted(2)),
        ev(
            50,
            NOBODY,
            NOBODY,
            Op::Heal {
                what: "restart zk-ens2".into(),
            },
        ),
        ev(60, 2, 1, Op::Acquire),
        ev(60, 3, 0, Op::Acquire),
        ev(70, 3, 0, granted(3)),
        ev(80, 3, 0, Op::Release { lease: 3 }),
        ev(900, 2, 1, refused),
    ];
    let report = checked(events, false, Duration::from_millis(500), ms(2000));
    let stuck = (report.violations.iter())
        .find(|v| v.kind == crate::safety::checker::Kind::Liveness)
        .expect("name 1 not granted again");
    let text = report.evidence(stuck);
    assert_shows(
        &text,
        &[
            "0.0400 client 1 name 1: granted lease 2",
            "0.0500 nemesis: Heal",
            "0.0600 client 2 name 1: Acquire",
            "0.9000 client 2 name 1: Refused",
        ],
        &["lease 1 ", "name 0"], // before the last grant, another name
    );
}

/// A name stuck long after the last heal, with many refusals before the heal and after the
/// bound: the evidence still shows the holder before the heal and how it let go, the heal,
/// the first refusals after it and the name's next grant, not only the history's last lines.
#[test]
fn evidence_of_a_stuck_name_shows_the_window_after_the_last_heal() {
    let t0 = Instant::now();
    let ms = |m: u64| t0 + Duration::from_millis(m);
    let ev = |m: u64, client: usize, op: Op| Event {
        at: ms(m),
        client,
        name: 1,
        op,
    };
    let granted = |lease| Op::Granted {
        lease,
        token: None,
        valid_until: ms(9000),
    };
    let refused = || Op::Refused {
        error: "timed out".into(),
        timed_out: true,
    };
    let mut events = vec![ev(0, 0, Op::Acquire), ev(10, 0, granted(1))];
    // Refusals before the heal, in the window (1000–1500 ms) and after it.
    for (from, n) in [(20, 40), (1010, 40), (1600, 80)] {
        for i in 0..n {
            events.push(ev(from + i * 10, 1 + (i as usize) % 4, Op::Acquire));
            events.push(ev(from + i * 10 + 5, 1 + (i as usize) % 4, refused()));
        }
    }
    events.push(Event {
        at: ms(1000),
        client: NOBODY,
        name: NOBODY,
        op: Op::Heal {
            what: "freeze m1".into(),
        },
    });
    events.push(ev(3100, 5, Op::Acquire));
    events.push(ev(3110, 5, granted(9)));
    // The last holder's end, among the refusals before the heal that are left out.
    events.push(ev(217, 0, Op::Release { lease: 1 }));
    events.push(ev(218, 0, Op::Released { lease: 1, ok: true }));
    events.sort_by_key(|e| e.at);
    let report = checked(events, false, Duration::from_millis(500), ms(4000));
    let stuck = (report.violations.iter())
        .find(|v| v.kind == crate::safety::checker::Kind::Liveness)
        .expect("name 1 not granted within 500 ms of the heal");
    let text = report.evidence(stuck);
    assert_shows(
        &text,
        &[
            "0.0100 client 0 name 1: granted lease 1",
            "1.0000 nemesis: Heal",
            "1.0100 client 1 name 1: Acquire",
            "1.0150 client 1 name 1: Refused",
            "3.1100 client 5 name 1: granted lease 9",
            // How the holder before the heal let go, wherever it fell.
            "0.2170 client 0 name 1: Release { lease: 1 }",
            "0.2180 client 0 name 1: Released { lease: 1, ok: true }",
        ],
        &[],
    );
    assert!(text.lines().count() <= 65, "too long:\n{text}");
}

/// The report of a history of a run that ended at `end`, checked with these rules.
fn checked(events: Vec<Event>, fencing: bool, recovery: Duration, end: Instant) -> Report {
    let rules = Rules {
        fencing,
        recovery,
        end,
        session_bound: false,
    };
    Report {
        seed: 0,
        grants: 2,
        refused: 0,
        unknown: 0,
        stale_writes_refused: 0,
        faults: BTreeMap::new(),
        server_errors: vec![],
        elapsed: Duration::from_secs(2),
        loss_to_signal: vec![],
        recovery: vec![],
        handoff: vec![],
        cut_races: vec![],
        clock_steps: vec![],
        violations: check(&events, &rules),
        events,
    }
}

/// Fails unless `text` contains every one of `wanted` and none of `unwanted`.
fn assert_shows(text: &str, wanted: &[&str], unwanted: &[&str]) {
    for want in wanted {
        assert!(text.contains(want), "{want:?} missing from:\n{text}");
    }
    for not in unwanted {
        assert!(!text.contains(not), "{not:?} should not be in:\n{text}");
    }
}
