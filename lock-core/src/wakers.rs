//! Wake-ups by key for a driver's waiters in this process: one `Notify` per key somebody holds
//! a [`Waker`] of, made with the first and gone with the last, so the map holds only keys in
//! use. A release here wakes the key's waiters at once instead of at their next poll. The file
//! driver keys it by lock name, PostgreSQL's pollers by advisory key.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::Notify;

/// This process's wake-up entries of one lock client (and its clones), keyed by `K`.
///
/// ```
/// use std::sync::Arc;
/// use lock_core::driver::Wakers;
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let wakers: Arc<Wakers<u64>> = Arc::default();
/// {
///     let waiter = wakers.waker(&7);
///     assert!(waiter.first()); // the first handle of key 7: its entry was made now
///     let released = waiter.notified();
///     tokio::pin!(released);
///     released.as_mut().enable(); // before the try that found the lock held
///     wakers.wake(&7); // a release of key 7 in this process
///     released.await; // woken
/// }
/// assert!(wakers.is_empty()); // the entry went with its last handle
/// # }
/// ```
pub struct Wakers<K>(Mutex<HashMap<K, Arc<Notify>>>);

impl<K> Default for Wakers<K> {
    fn default() -> Self {
        Wakers(Mutex::new(HashMap::new()))
    }
}

impl<K: Eq + Hash + Clone> Wakers<K> {
    /// A handle on `key`'s entry, made if missing ([`Waker::first`] says so).
    pub fn waker(self: &Arc<Self>, key: &K) -> Waker<K> {
        let mut map = self.0.lock();
        let first = !map.contains_key(key);
        Waker {
            notify: map.entry(key.clone()).or_default().clone(),
            wakers: self.clone(),
            key: key.clone(),
            first,
            left: false,
        }
    }

    /// Wakes every waiter of `key` waiting now (a waiter enables its `notified()` before the
    /// try it waits after, so a wake between the two is not lost).
    pub fn wake(&self, key: &K) {
        if let Some(n) = self.0.lock().get(key) {
            n.notify_waiters();
        }
    }

    /// Whether `key` has an entry (somebody holds a handle of it).
    pub fn contains(&self, key: &K) -> bool {
        self.0.lock().contains_key(key)
    }

    /// The keys with an entry.
    pub fn keys(&self) -> Vec<K> {
        self.0.lock().keys().cloned().collect()
    }

    /// How many keys have an entry.
    pub fn len(&self) -> usize {
        self.0.lock().len()
    }

    /// Whether no key has an entry.
    pub fn is_empty(&self) -> bool {
        self.0.lock().is_empty()
    }
}

/// A waiter's or a lease's handle on a key's wake-up entry (derefs to its `Notify`). The entry
/// goes with the last handle.
pub struct Waker<K: Eq + Hash + Clone> {
    notify: Arc<Notify>,
    wakers: Arc<Wakers<K>>,
    key: K,
    first: bool,
    left: bool,
}

impl<K: Eq + Hash + Clone> Waker<K> {
    /// Whether this handle made its key's entry (no handle of the key was held before it).
    pub fn first(&self) -> bool {
        self.first
    }

    /// Its key.
    pub fn key(&self) -> &K {
        &self.key
    }

    /// Lets go of the key's entry now, as dropping the handle does (which then does nothing
    /// more; the handle is not woken after), and says whether the entry went with it: no other
    /// handle of the key is held. For a driver with work to do when a key's last waiter leaves.
    pub fn leave(&mut self) -> bool {
        if std::mem::replace(&mut self.left, true) {
            return false;
        }
        let mut map = self.wakers.0.lock();
        // Handles are only made under this lock, so the count cannot grow meanwhile: two is
        // the map's and this one's.
        let last = Arc::strong_count(&self.notify) == 2
            && map
                .get(&self.key)
                .is_some_and(|n| Arc::ptr_eq(n, &self.notify));
        if last {
            map.remove(&self.key);
        }
        // Under the lock, so that a handle leaving next counts without this one (dropped
        // after the lock, two handles leaving at once could each count the other and leave
        // the entry for good). The detached one is shared: no allocation.
        self.notify = detached();
        last
    }
}

/// The `Notify` of every handle that left: nobody wakes it.
fn detached() -> Arc<Notify> {
    static DETACHED: std::sync::LazyLock<Arc<Notify>> = std::sync::LazyLock::new(Arc::default);
    DETACHED.clone()
}

impl<K: Eq + Hash + Clone> std::ops::Deref for Waker<K> {
    type Target = Notify;
    fn deref(&self) -> &Notify {
        &self.notify
    }
}

impl<K: Eq + Hash + Clone> Drop for Waker<K> {
    fn drop(&mut self) {
        self.leave();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_entry_goes_with_the_last_handle_of_its_key_only() {
        let wakers: Arc<Wakers<&str>> = Arc::default();
        let (mut a1, mut a2, b) = (wakers.waker(&"a"), wakers.waker(&"a"), wakers.waker(&"b"));
        assert!(a1.first() && !a2.first() && b.first());
        assert_eq!(wakers.len(), 2);
        assert!(!a1.leave(), "a second handle of `a` is held");
        assert!(wakers.contains(&"a"));
        drop(b);
        assert!(!wakers.contains(&"b"), "the only handle of `b` was dropped");
        assert!(a2.leave(), "the last handle of `a`");
        assert!(!a2.leave(), "a second leave of one handle");
        drop((a1, a2));
        assert!(wakers.is_empty());
        // A key whose entry went is made again, first again.
        assert!(wakers.waker(&"a").first());
    }

    /// Two handles of one key dropped at once on two threads: the entry goes all the same
    /// (each counts under the map's lock without the other's handle once that one left).
    #[test]
    fn handles_dropped_at_once_leave_no_entry() {
        let wakers: Arc<Wakers<u32>> = Arc::default();
        let barrier = Arc::new(std::sync::Barrier::new(2));
        for round in 0..20_000u32 {
            let (a, b) = (wakers.waker(&round), wakers.waker(&round));
            let other = {
                let barrier = barrier.clone();
                std::thread::spawn(move || {
                    barrier.wait();
                    drop(b);
                })
            };
            barrier.wait();
            drop(a);
            other
                .join()
                .unwrap_or_else(|_| panic!("the other thread panicked"));
            assert!(
                wakers.is_empty(),
                "round {round}: both handles of the key were dropped and its entry stayed"
            );
        }
    }

    #[tokio::test]
    async fn a_wake_reaches_the_waiters_of_its_key_only() {
        let wakers: Arc<Wakers<u8>> = Arc::default();
        let (one, two) = (wakers.waker(&1), wakers.waker(&2));
        let (woken, not) = (one.notified(), two.notified());
        tokio::pin!(woken, not);
        woken.as_mut().enable();
        not.as_mut().enable();
        wakers.wake(&1);
        tokio::time::timeout(std::time::Duration::from_secs(5), woken)
            .await
            .unwrap_or_else(|_| panic!("the waiter of key 1 was not woken"));
        let quiet = tokio::time::timeout(std::time::Duration::from_millis(50), not).await;
        assert!(quiet.is_err(), "a wake of key 1 woke key 2's waiter");
    }
}
