//! A future wrapper that remembers how the runtime ran it: when it was last woken and when its
//! last poll began. A grant recorded long after the driver's answer then tells whether the
//! runtime was late to poll the acquisition (woken early, polled late), or the poll itself took
//! long (the thread was stopped, or something blocked it).

use parking_lot::Mutex;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::Instant;

/// How the runtime ran a future, as far as [`Polled`] saw.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Schedule {
    /// The last wake-up before the last poll (`None`: it never went pending, or its waker was
    /// not used).
    pub(super) woken: Option<Instant>,
    /// When the last poll began.
    pub(super) polled: Option<Instant>,
}

/// `inner`, with its [`Schedule`] kept up to date.
pub(super) struct Polled<F> {
    inner: Pin<Box<F>>,
    woken: Arc<WakeTime>,
    schedule: Schedule,
}

impl<F: Future> Polled<F> {
    pub(super) fn new(inner: F) -> Self {
        Self {
            inner: Box::pin(inner),
            woken: Arc::default(),
            schedule: Schedule::default(),
        }
    }

    /// The schedule so far (after the future completed: of the poll that completed it).
    pub(super) fn schedule(&self) -> Schedule {
        self.schedule
    }
}

impl<F: Future> Future for Polled<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        // `Polled` is `Unpin`: the inner future is boxed.
        let this = self.get_mut();
        this.schedule = Schedule {
            woken: this.woken.take(),
            polled: Some(Instant::now()),
        };
        let waker = Waker::from(Arc::new(Noting {
            inner: cx.waker().clone(),
            woken: this.woken.clone(),
        }));
        this.inner.as_mut().poll(&mut Context::from_waker(&waker))
    }
}

/// The time of the latest wake-up not yet taken by a poll.
#[derive(Default)]
struct WakeTime(Mutex<Option<Instant>>);

impl WakeTime {
    fn note(&self) {
        *self.0.lock() = Some(Instant::now());
    }

    fn take(&self) -> Option<Instant> {
        self.0.lock().take()
    }
}

/// A waker that notes the time, then wakes the runtime's waker.
struct Noting {
    inner: Waker,
    woken: Arc<WakeTime>,
}

impl Wake for Noting {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.note();
        self.inner.wake_by_ref();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn notes_the_wake_before_the_last_poll() {
        let before = Instant::now();
        let mut f = Polled::new(tokio::time::sleep(Duration::from_millis(20)));
        (&mut f).await;
        let s = f.schedule();
        let (Some(woken), Some(polled)) = (s.woken, s.polled) else {
            panic!("a sleep goes pending and is woken once: {s:?}");
        };
        assert!(before + Duration::from_millis(20) <= woken, "{s:?}");
        assert!(woken <= polled, "woken after the poll it caused: {s:?}");
    }

    #[tokio::test]
    async fn a_ready_future_has_no_wake() {
        let mut f = Polled::new(std::future::ready(7));
        assert_eq!((&mut f).await, 7);
        let s = f.schedule();
        assert_eq!(s.woken, None);
        assert!(s.polled.is_some());
    }
}
