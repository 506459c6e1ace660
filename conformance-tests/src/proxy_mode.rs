//! What a [`FaultProxy`](crate::FaultProxy)'s link does now, and the waits of a chunk on
//! it: the proxy's one notion of time on the wire.

use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

/// The fault in force on a proxy's link (a cut is an event, not a mode).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    Pass,
    Delay(Duration),
    Blackhole,
}

/// Returns once the link is not blackholed; `None` if the proxy is gone.
pub(crate) async fn until_open(mode: &mut watch::Receiver<Mode>) -> Option<()> {
    while *mode.borrow_and_update() == Mode::Blackhole {
        mode.changed().await.ok()?;
    }
    Some(())
}

/// Returns once a chunk that `arrived` may leave: the link is not blackholed and, under a
/// delay, the delay has passed since it arrived (a change of fault meanwhile counts at once);
/// `None` if the proxy is gone.
pub(crate) async fn until_due(mode: &mut watch::Receiver<Mode>, arrived: Instant) -> Option<()> {
    loop {
        let m = *mode.borrow_and_update();
        match m {
            Mode::Pass => return Some(()),
            Mode::Delay(d) => tokio::select! {
                () = tokio::time::sleep_until(arrived + d) => return Some(()),
                changed = mode.changed() => changed.ok()?,
            },
            Mode::Blackhole => mode.changed().await.ok()?,
        }
    }
}
