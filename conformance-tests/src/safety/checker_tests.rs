//! The checker's own tests: small hand-made histories, one rule each.

use super::*;

struct H {
    t0: Instant,
    events: Vec<Event>,
}

impl H {
    fn new() -> Self {
        H {
            t0: Instant::now(),
            events: vec![],
        }
    }
    fn ms(&self, ms: u64) -> Instant {
        self.t0 + Duration::from_millis(ms)
    }
    fn at(&mut self, ms: u64, client: usize, op: Op) -> &mut Self {
        let at = self.ms(ms);
        self.events.push(Event {
            at,
            client,
            name: 0,
            op,
        });
        self
    }
    fn grant(
        &mut self,
        ms: u64,
        client: usize,
        lease: LeaseId,
        token: u64,
        until: u64,
    ) -> &mut Self {
        let valid_until = self.ms(until);
        self.at(ms, client, Op::Acquire).at(
            ms,
            client,
            Op::Granted {
                lease,
                token: Some(token),
                valid_until,
            },
        )
    }
    fn kinds(&self, end: u64) -> Vec<Kind> {
        self.kinds_with(end, None)
    }
    fn rules(&self, end: u64, cut_notice: Option<Duration>) -> Rules {
        Rules {
            fencing: true,
            recovery: Duration::from_millis(500),
            end: self.ms(end),
            cut_notice,
        }
    }
    fn sorted(&self) -> Vec<Event> {
        let mut events = self.events.clone();
        events.sort_by_key(|e| e.at);
        events
    }
    fn kinds_with(&self, end: u64, cut_notice: Option<Duration>) -> Vec<Kind> {
        let rules = self.rules(end, cut_notice);
        check(&self.sorted(), &rules)
            .into_iter()
            .map(|v| v.kind)
            .collect()
    }
}

#[test]
fn hand_off_by_release_and_by_expiry_is_clean() {
    let mut h = H::new();
    h.grant(0, 1, 0, 1, 100)
        .at(50, 1, Op::Release { lease: 0 })
        .at(51, 1, Op::Released { lease: 0, ok: true })
        .grant(52, 2, 1, 2, 152)
        // Client 2 stops renewing; its lost signal fires at valid_until; client 3 after.
        .at(152, 2, Op::LostSignal { lease: 1 })
        .grant(160, 3, 2, 3, 260)
        .at(200, 3, Op::Release { lease: 2 });
    assert_eq!(h.kinds(300), vec![]);
}

#[test]
fn two_believers_at_once_are_an_overlap() {
    let mut h = H::new();
    h.grant(0, 1, 0, 1, 100).grant(10, 2, 1, 2, 110);
    let k = h.kinds(300);
    assert!(k.contains(&Kind::Overlap), "{k:?}");
    assert!(k.contains(&Kind::LossNotSeen), "{k:?}");
}

#[test]
fn a_holder_that_released_is_not_a_loss_not_seen() {
    let mut h = H::new();
    // Released at 50, but the successor was granted at 40: a mutual-exclusion failure.
    h.grant(0, 1, 0, 1, 100)
        .grant(40, 2, 1, 2, 140)
        .at(50, 1, Op::Release { lease: 0 })
        .at(51, 1, Op::Released { lease: 0, ok: true });
    let k = h.kinds(300);
    assert!(k.contains(&Kind::Overlap), "{k:?}");
    assert!(!k.contains(&Kind::LossNotSeen), "{k:?}");
}

#[test]
fn a_lost_signal_after_the_regrant_is_caught_unless_valid_until_passed() {
    let mut h = H::new();
    h.grant(0, 1, 0, 1, 100)
        .grant(120, 2, 1, 2, 220)
        .at(130, 1, Op::LostSignal { lease: 0 });
    // valid_until (100) passed before the re-grant (120): the holder knew.
    assert_eq!(h.kinds(300), vec![]);
    let mut late = H::new();
    // A look extends the belief to 200 (renewed), then the lock goes elsewhere.
    let renewed = Op::Looked {
        lease: 0,
        valid_until: late.ms(200),
        lost: false,
    };
    late.grant(0, 1, 0, 1, 100)
        .at(50, 1, renewed)
        .grant(120, 2, 1, 2, 220)
        .at(130, 1, Op::LostSignal { lease: 0 });
    let k = late.kinds(300);
    assert!(k.contains(&Kind::LossNotSeen), "{k:?}");
}

#[test]
fn a_resurrected_belief_opens_a_new_span() {
    let mut h = H::new();
    h.grant(0, 1, 0, 1, 100)
        .at(100, 1, Op::LostSignal { lease: 0 })
        .grant(110, 2, 1, 2, 210);
    let resurrected = Op::Looked {
        lease: 0,
        valid_until: h.ms(250),
        lost: false,
    };
    h.at(150, 1, resurrected);
    let k = h.kinds(300);
    assert!(k.contains(&Kind::Overlap), "{k:?}");
}

#[test]
fn tokens_must_increase_in_grant_order() {
    let mut h = H::new();
    h.grant(0, 1, 0, 5, 100)
        .at(10, 1, Op::Release { lease: 0 })
        .grant(20, 2, 1, 5, 120)
        .at(30, 2, Op::Release { lease: 1 });
    assert_eq!(h.kinds(300), vec![Kind::Fencing]);
}

#[test]
fn the_store_must_not_accept_a_lower_token() {
    let mut h = H::new();
    h.at(
        0,
        1,
        Op::Write {
            lease: 1,
            token: Some(7),
            accepted: true,
        },
    )
    .at(
        5,
        2,
        Op::Write {
            lease: 0,
            token: Some(6),
            accepted: true,
        },
    );
    assert_eq!(h.kinds(10), vec![Kind::Fencing]);
}

/// A session-bound holder cut at 50 ms: the server frees its lock at once, the successor's
/// grant returns at 50.2 ms and the holder's own notice (its lost signal) at 50.6 ms — the
/// race the 1795515460553999065 run hit on PostgreSQL. Within the notice it is a race;
/// after it, or without a cut, or for a driver whose lock outlives its connection, it is
/// a violation.
#[test]
fn a_cut_session_holder_racing_its_successor_is_a_race_only_within_the_notice() {
    let race = |notice_ms: u64, lost_us: u64, cut: bool| {
        let mut h = H::new();
        h.grant(0, 1, 0, 1, 1000);
        if cut {
            h.at(50, 1, Op::Cut);
        }
        let granted = h.ms(50) + Duration::from_micros(200);
        let lost = h.ms(50) + Duration::from_micros(lost_us);
        h.events.push(Event {
            at: granted,
            client: 2,
            name: 0,
            op: Op::Granted {
                lease: 1,
                token: Some(2),
                valid_until: h.ms(1050),
            },
        });
        h.events.push(Event {
            at: lost,
            client: 1,
            name: 0,
            op: Op::LostSignal { lease: 0 },
        });
        let rules = h.rules(2000, Some(Duration::from_millis(notice_ms)));
        let events = h.sorted();
        let kinds: Vec<Kind> = check(&events, &rules).iter().map(|v| v.kind).collect();
        (kinds, cut_races(&events, &rules))
    };
    let (kinds, races) = race(100, 600, true);
    assert_eq!(
        kinds,
        vec![],
        "a notice 0.6 ms after the cut is within 100 ms"
    );
    assert_eq!(races, vec![Duration::from_micros(400)]);
    let (kinds, races) = race(100, 150_000, true);
    assert!(
        kinds.contains(&Kind::LossNotSeen),
        "{kinds:?}: a notice 150 ms late"
    );
    assert!(races.is_empty());
    let (kinds, _) = race(100, 600, false);
    assert!(
        kinds.contains(&Kind::Overlap),
        "{kinds:?}: no cut, no excuse"
    );
    // A lease granted on a new connection after the cut was not cut.
    let mut h = H::new();
    h.at(10, 1, Op::Cut)
        .grant(30, 1, 0, 1, 1000)
        .grant(40, 2, 1, 2, 1040)
        .at(41, 1, Op::LostSignal { lease: 0 });
    let k = h.kinds_with(2000, Some(Duration::from_millis(100)));
    assert!(
        k.contains(&Kind::Overlap),
        "{k:?}: granted 20 ms after the cut"
    );
}

#[test]
fn without_a_cut_notice_a_cut_excuses_nothing() {
    let mut h = H::new();
    h.grant(0, 1, 0, 1, 100)
        .at(10, 1, Op::Cut)
        .grant(11, 2, 1, 2, 110)
        .at(12, 1, Op::LostSignal { lease: 0 });
    assert!(h.kinds(300).contains(&Kind::Overlap));
    assert!(h.kinds_with(300, Some(Duration::from_millis(5))).is_empty());
}

#[test]
fn a_name_not_granted_after_the_last_heal_and_a_hung_acquire_are_liveness() {
    let mut h = H::new();
    h.grant(0, 1, 0, 1, 100)
        .at(10, 1, Op::Release { lease: 0 })
        .at(
            20,
            9,
            Op::Heal {
                what: "blackhole".into(),
            },
        )
        .at(30, 2, Op::Acquire);
    let k = h.kinds(1000);
    assert_eq!(k, vec![Kind::Liveness, Kind::Liveness], "{k:?}");
    // A run that ends before the bound is not judged on (d)'s first part.
    assert_eq!(h.kinds(400), vec![Kind::Liveness]);
}

/// Where the history says when the servers served again after the last heal, (d) counts from
/// there: a grant soon after that is on time however long the election took, and a name not
/// granted within the bound of it is still a violation.
#[test]
fn liveness_counts_from_the_servers_serving_again() {
    let heal = Op::Heal {
        what: "freeze m1".into(),
    };
    // Served again 900 ms after the heal, granted 100 ms later: on time.
    let mut h = H::new();
    h.grant(0, 1, 0, 1, 100)
        .at(10, 1, Op::Release { lease: 0 })
        .at(20, NOBODY, heal.clone())
        .at(920, NOBODY, Op::Serving)
        .grant(1020, 2, 1, 2, 1100)
        .at(1030, 2, Op::Release { lease: 1 });
    assert_eq!(h.kinds(3000), vec![], "granted 100 ms after serving again");
    // Without the servers' word, the same grant is 1 s after the heal: late.
    h.events.retain(|e| e.op != Op::Serving);
    assert_eq!(h.kinds(3000), vec![Kind::Liveness]);
    // Serving again, then not granted within the bound of it.
    let mut h = H::new();
    h.grant(0, 1, 0, 1, 100)
        .at(10, 1, Op::Release { lease: 0 })
        .at(20, NOBODY, heal)
        .at(920, NOBODY, Op::Serving)
        .grant(1500, 2, 1, 2, 1600)
        .at(1510, 2, Op::Release { lease: 1 });
    let v = check(&h.sorted(), &h.rules(3000, None));
    assert_eq!(v.len(), 1, "{v:?}");
    assert_eq!(v[0].kind, Kind::Liveness);
    assert!(
        v[0].detail
            .contains("the servers serving again at 920ms, 900ms after the last heal at 20ms"),
        "{}",
        v[0].detail
    );
}
