//! What a driver reported, captured: the spans, events and metrics recorded for the lock names
//! a case watches, through one process-wide tracing subscriber and metrics recorder.
//!
//! Cases run at once in one process, and the recorder and the subscriber are global, so each
//! case watches its own fresh names ([`Capture::watch`]) and reads only what carries them. The
//! lock name is turned on as a metric label for that ([`lock_core::telemetry::label_lock_names`]).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, OnceLock};

use std::sync::atomic::{AtomicU64, Ordering};

use lock_core::LockName;
use metrics::{
    Counter, Gauge, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder, SharedString, Unit,
};
use parking_lot::Mutex;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// A span as it closed (or as it is, while open): its name and its fields as text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpanRecord {
    /// The span's name (`lock.acquire`, ...).
    pub name: &'static str,
    /// Its fields, recorded at creation and later.
    pub fields: BTreeMap<String, String>,
    /// Whether it has closed.
    pub closed: bool,
}

impl SpanRecord {
    /// The field `key`, if recorded.
    pub fn field(&self, key: &str) -> Option<&str> {
        self.fields.get(key).map(String::as_str)
    }
}

/// An event: its fields (the message as `message`) and the span it was recorded in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventRecord {
    /// The event's level.
    pub level: tracing::Level,
    /// Its fields.
    pub fields: BTreeMap<String, String>,
    /// The name of the span it was recorded in, if any.
    pub span: Option<&'static str>,
}

impl EventRecord {
    /// The field `key`, if recorded.
    pub fn field(&self, key: &str) -> Option<&str> {
        self.fields.get(key).map(String::as_str)
    }
}

#[derive(Default)]
struct Store {
    watched: HashSet<String>,
    /// Every watched span by id, open or closed, in order of creation.
    spans: Vec<(Id, SpanRecord)>,
    events: Vec<(String, EventRecord)>,
}

/// The metrics of watched names, each series as its recorder handle left it.
#[derive(Default)]
struct Kept {
    counters: HashMap<Labels, Arc<AtomicU64>>,
    gauges: HashMap<Labels, Arc<AtomicU64>>,
    histograms: HashMap<Labels, Arc<Values>>,
}

/// A metric's name and its labels, sorted.
type Labels = (String, Vec<(String, String)>);

/// A histogram's values.
#[derive(Default)]
struct Values(Mutex<Vec<f64>>);

impl HistogramFn for Values {
    fn record(&self, value: f64) {
        self.0.lock().push(value);
    }
}

/// The recorder: a series whose `lock.name` is watched gets storage; every other one a no-op
/// handle, so the rest of the process (thousands of names in a conformance run) costs nothing
/// and never waits here.
struct WatchingRecorder {
    store: Arc<Mutex<Store>>,
    series: Arc<Mutex<Kept>>,
}

impl WatchingRecorder {
    /// `key` as kept, if its lock name is watched.
    fn watched(&self, key: &Key) -> Option<Labels> {
        let name = key.labels().find(|l| l.key() == "lock.name")?;
        if !self.store.lock().watched.contains(name.value()) {
            return None;
        }
        let mut labels: Vec<(String, String)> = key
            .labels()
            .map(|l| (l.key().to_owned(), l.value().to_owned()))
            .collect();
        labels.sort();
        Some((key.name().to_owned(), labels))
    }
}

impl Recorder for WatchingRecorder {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        match self.watched(key) {
            Some(k) => Counter::from_arc(self.series.lock().counters.entry(k).or_default().clone()),
            None => Counter::noop(),
        }
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        match self.watched(key) {
            Some(k) => Gauge::from_arc(self.series.lock().gauges.entry(k).or_default().clone()),
            None => Gauge::noop(),
        }
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        match self.watched(key) {
            Some(k) => {
                Histogram::from_arc(self.series.lock().histograms.entry(k).or_default().clone())
            }
            None => Histogram::noop(),
        }
    }
}

/// The process's capture of spans, events and metrics ([`capture`]).
pub struct Capture {
    store: Arc<Mutex<Store>>,
    series: Arc<Mutex<Kept>>,
}

/// The capture, installed on first use as this process's global tracing subscriber and metrics
/// recorder. `None` if either was already installed by someone else.
pub fn capture() -> Option<&'static Capture> {
    static CAPTURE: OnceLock<Option<Capture>> = OnceLock::new();
    CAPTURE
        .get_or_init(|| {
            let store = Arc::new(Mutex::new(Store::default()));
            let series = Arc::new(Mutex::new(Kept::default()));
            let recorder = WatchingRecorder {
                store: store.clone(),
                series: series.clone(),
            };
            let layer = CaptureLayer {
                store: store.clone(),
            };
            let subscriber = tracing_subscriber::registry().with(layer);
            tracing::subscriber::set_global_default(subscriber).ok()?;
            metrics::set_global_recorder(recorder).ok()?;
            lock_core::telemetry::label_lock_names(true);
            Some(Capture { store, series })
        })
        .as_ref()
}

impl Capture {
    /// Captures what carries `name` from now on.
    pub fn watch(&self, name: &LockName) {
        self.store.lock().watched.insert(name.as_str().to_owned());
    }

    /// The spans of `name` named `span`, in order of creation.
    pub fn spans(&self, name: &LockName, span: &str) -> Vec<SpanRecord> {
        let s = self.store.lock();
        s.spans
            .iter()
            .map(|(_, r)| r)
            .filter(|r| r.name == span && r.field("lock.name") == Some(name.as_str()))
            .cloned()
            .collect()
    }

    /// The events of `name`, in order.
    pub fn events(&self, name: &LockName) -> Vec<EventRecord> {
        let s = self.store.lock();
        s.events
            .iter()
            .filter(|(n, _)| n == name.as_str())
            .map(|(_, e)| e.clone())
            .collect()
    }

    /// Everything captured of `name` as text: its spans, its events, and its metrics' label
    /// sets (for a search, such as for a password that must not be there).
    pub fn dump(&self, name: &LockName) -> String {
        let s = self.store.lock();
        let spans = s
            .spans
            .iter()
            .map(|(_, r)| r)
            .filter(|r| r.field("lock.name") == Some(name.as_str()));
        let events = s.events.iter().filter(|(n, _)| n == name.as_str());
        let m = self.series.lock();
        let series = m
            .counters
            .keys()
            .chain(m.gauges.keys())
            .chain(m.histograms.keys())
            .filter(|k| {
                k.1.iter()
                    .any(|(a, b)| a == "lock.name" && b == name.as_str())
            });
        format!(
            "spans {:?}; events {:?}; metrics {:?}",
            spans.collect::<Vec<_>>(),
            events.collect::<Vec<_>>(),
            series.collect::<Vec<_>>()
        )
    }

    /// The counter `metric` of `name` summed over every label set that has `labels`.
    pub fn counter(&self, name: &LockName, metric: &str, labels: &[(&str, &str)]) -> u64 {
        let m = self.series.lock();
        m.counters
            .iter()
            .filter(|(k, _)| matches(k, name, metric, labels))
            .map(|(_, v)| v.load(Ordering::Relaxed))
            .sum()
    }

    /// The gauge `metric` of `name`: the sum of its increments and decrements so far, over
    /// every label set that has `labels`.
    pub fn gauge(&self, name: &LockName, metric: &str, labels: &[(&str, &str)]) -> f64 {
        let m = self.series.lock();
        m.gauges
            .iter()
            .filter(|(k, _)| matches(k, name, metric, labels))
            .map(|(_, v)| f64::from_bits(v.load(Ordering::Relaxed)))
            .sum()
    }

    /// The values the histogram `metric` of `name` recorded, over every label set that has
    /// `labels`.
    pub fn histogram(&self, name: &LockName, metric: &str, labels: &[(&str, &str)]) -> Vec<f64> {
        let m = self.series.lock();
        m.histograms
            .iter()
            .filter(|(k, _)| matches(k, name, metric, labels))
            .flat_map(|(_, v)| v.0.lock().clone())
            .collect()
    }
}

fn matches(k: &Labels, name: &LockName, metric: &str, labels: &[(&str, &str)]) -> bool {
    let has = |key: &str, value: &str| k.1.iter().any(|(a, b)| a == key && b == value);
    k.0 == metric && has("lock.name", name.as_str()) && labels.iter().all(|(a, b)| has(a, b))
}

struct CaptureLayer {
    store: Arc<Mutex<Store>>,
}

#[derive(Default)]
struct Fields(BTreeMap<String, String>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for CaptureLayer {
    /// Only what names a lock: every other span and event in the process (a client library's
    /// trace events) is never built for this layer.
    fn register_callsite(
        &self,
        metadata: &'static tracing::Metadata<'static>,
    ) -> tracing::subscriber::Interest {
        if metadata.fields().field("lock.name").is_some() {
            tracing::subscriber::Interest::always()
        } else {
            tracing::subscriber::Interest::never()
        }
    }

    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, _ctx: Context<'_, S>) {
        let mut f = Fields::default();
        attrs.record(&mut f);
        let mut s = self.store.lock();
        if f.0.get("lock.name").is_some_and(|n| s.watched.contains(n)) {
            let record = SpanRecord {
                name: attrs.metadata().name(),
                fields: f.0,
                closed: false,
            };
            s.spans.push((id.clone(), record));
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, _ctx: Context<'_, S>) {
        let mut s = self.store.lock();
        if let Some((_, r)) = s.spans.iter_mut().rev().find(|(i, r)| i == id && !r.closed) {
            let mut f = Fields::default();
            values.record(&mut f);
            r.fields.extend(f.0);
        }
    }

    fn on_close(&self, id: Id, _ctx: Context<'_, S>) {
        let mut s = self.store.lock();
        if let Some((_, r)) = s
            .spans
            .iter_mut()
            .rev()
            .find(|(i, r)| *i == id && !r.closed)
        {
            r.closed = true;
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut f = Fields::default();
        event.record(&mut f);
        let span = ctx.event_span(event);
        let mut s = self.store.lock();
        // The event's own lock.name, else its span's.
        let name = f.0.get("lock.name").cloned().or_else(|| {
            let id = span.as_ref()?.id();
            let (_, r) = s.spans.iter().rev().find(|(i, r)| *i == id && !r.closed)?;
            r.field("lock.name").map(str::to_owned)
        });
        let Some(name) = name.filter(|n| s.watched.contains(n)) else {
            return;
        };
        let record = EventRecord {
            level: *event.metadata().level(),
            fields: f.0,
            span: span.map(|s| s.name()),
        };
        s.events.push((name, record));
    }
}
