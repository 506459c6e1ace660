//! Built without the `telemetry` feature: nothing reaches a recorder or a subscriber the
//! application installed, and the AtRisk and Lost events are still logged.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use metrics_util::debugging::DebuggingRecorder;
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

use crate::memory::MemoryLock;
use crate::{DistributedLock, LockName, LockOptions};

/// Counts the spans it is asked to make and the events it gets.
#[derive(Clone, Default)]
struct Counting {
    spans: Arc<AtomicUsize>,
    events: Arc<AtomicUsize>,
}

impl Subscriber for Counting {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1 + self.spans.fetch_add(1, Ordering::SeqCst) as u64)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, _: &Event<'_>) {
        self.events.fetch_add(1, Ordering::SeqCst);
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

#[test]
fn telemetry_off_records_nothing() {
    let recorder = DebuggingRecorder::new();
    let seen = recorder.snapshotter();
    let counting = Counting::default();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let _subscriber = tracing::subscriber::set_default(counting.clone());
    metrics::with_local_recorder(&recorder, || {
        rt.block_on(async {
            let lock = MemoryLock::new();
            let name = LockName::new("off").unwrap_or_else(|e| panic!("{e}"));
            let opts = LockOptions::new(Duration::from_secs(5));
            let lease = lock.try_acquire(&name, &opts).await;
            let lease = lease.unwrap_or_else(|e| panic!("{e}"));
            let lease = lease.unwrap_or_else(|| panic!("a free name was refused"));
            assert!(lock
                .try_acquire(&name, &opts)
                .await
                .is_ok_and(|l| l.is_none()));
            lease.renew().await.unwrap_or_else(|e| panic!("{e}"));
            lease.release().await.unwrap_or_else(|e| panic!("{e}"));
            // Left to expire: its loss is an event, logged with or without the feature.
            let short = LockOptions::new(Duration::from_millis(100));
            let lapsing = lock.try_acquire(&name, &short).await;
            let lapsing = lapsing.unwrap_or_else(|e| panic!("{e}"));
            let lapsing = lapsing.unwrap_or_else(|| panic!("a free name was refused"));
            tokio::time::sleep(Duration::from_millis(300)).await;
            // Lost by the clock alone: said when the holder next asks.
            assert!(lapsing.renew().await.is_err(), "an expired lease renewed");
        })
    });
    let metrics = seen.snapshot().into_vec();
    let spans = counting.spans.load(Ordering::SeqCst);
    let events = counting.events.load(Ordering::SeqCst);
    assert!(
        events > 0,
        "the expired lease's loss was not logged as an event"
    );
    assert!(
        metrics.is_empty() && spans == 0,
        "built without the feature, yet {spans} spans made and these metrics recorded: \
         {metrics:?}"
    );
}
