//! The memory driver against a model of the lock family: random sequences of `try_acquire` in
//! random modes and releases, on one name, by several clients. After every step the holders
//! may hold together (`Mode::hold_together`), a request is granted exactly when the model says
//! it may join them (no waiter is queued here, so nothing else decides), tokens strictly
//! increase, `holders` lists exactly the model's holders, and a mismatched permit count is
//! `PermitsMismatch` naming both counts.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure report

use std::time::Duration;

use lock_core::driver::Admission;
use lock_core::memory::MemoryLock;
use lock_core::{DistributedLock, Error, Lease, LockName, LockOptions, Mode};
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Step {
    Take(Mode),
    /// Release the held lease at this index (modulo the number held).
    Release(usize),
}

fn mode() -> impl Strategy<Value = Mode> {
    prop_oneof![
        Just(Mode::Exclusive),
        Just(Mode::Shared),
        (1u32..4).prop_map(Mode::Permits),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => mode().prop_map(Step::Take),
        2 => any::<usize>().prop_map(Step::Release),
    ]
}

async fn run(steps: Vec<Step>) -> Result<(), TestCaseError> {
    let locks = MemoryLock::new();
    let name = LockName::new("model").unwrap();
    let mut held: Vec<(Mode, Box<dyn Lease>)> = Vec::new();
    let mut last_token = 0;
    for s in steps {
        match s {
            Step::Take(mode) => {
                let modes: Vec<Mode> = held.iter().map(|(m, _)| *m).collect();
                let expected = mode.admits(modes.clone(), modes.clone());
                let opts = LockOptions::new(Duration::from_secs(60)).mode(mode);
                let got = locks.try_acquire(&name, &opts).await;
                match (expected, got) {
                    (Admission::Yes, Ok(Some(lease))) => {
                        let t = lease.fencing_token().unwrap().get();
                        prop_assert!(t > last_token, "token {t} after {last_token}");
                        last_token = t;
                        held.push((mode, lease));
                    }
                    (Admission::No, Ok(None)) => {}
                    (
                        Admission::Mismatch { held: k },
                        Err(Error::PermitsMismatch { held, asked, .. }),
                    ) => {
                        prop_assert_eq!(held, k);
                        prop_assert_eq!(Some(asked), mode.limit());
                    }
                    (e, g) => prop_assert!(
                        false,
                        "{mode:?} beside {modes:?}: the model says {e:?}, the driver {:?}",
                        g.map(|l| l.is_some())
                    ),
                }
            }
            Step::Release(i) if !held.is_empty() => {
                let (_, lease) = held.remove(i % held.len());
                lease.release().await.unwrap();
            }
            Step::Release(_) => {}
        }
        let modes: Vec<Mode> = held.iter().map(|(m, _)| *m).collect();
        prop_assert!(Mode::hold_together(modes.clone()), "{modes:?}");
        let mut shown: Vec<(Mode, u64)> = (locks.holders(&name).await.unwrap().iter())
            .map(|h| (h.mode, h.fencing_token.unwrap().get()))
            .collect();
        let mut expected: Vec<(Mode, u64)> = (held.iter())
            .map(|(m, l)| (*m, l.fencing_token().unwrap().get()))
            .collect();
        shown.sort_by_key(|x| x.1);
        expected.sort_by_key(|x| x.1);
        prop_assert_eq!(shown, expected);
    }
    for (_, lease) in held {
        lease.release().await.unwrap();
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    #[test]
    fn the_memory_driver_follows_the_family_model(steps in proptest::collection::vec(step(), 1..40)) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(run(steps))?;
    }
}
