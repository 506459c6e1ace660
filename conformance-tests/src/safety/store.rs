//! The fenced store: an in-process model of a storage that keeps, per name, the highest token
//! it has accepted and refuses lower ones (like the `fenced_write` example).

use parking_lot::Mutex;
use std::collections::HashMap;

/// Per name, the highest token accepted so far.
#[derive(Debug, Default)]
pub struct FencedStore {
    highest: Mutex<HashMap<usize, u64>>,
}

impl FencedStore {
    /// A write to `name` with `token`: accepted unless a higher token was accepted before
    /// (the same token again is the same holder writing again). A driver without fencing
    /// writes without a token, which a fenced store cannot check: accepted.
    pub fn write(&self, name: usize, token: Option<u64>) -> bool {
        let Some(token) = token else {
            return true;
        };
        let mut highest = self.highest.lock();
        let h = highest.entry(name).or_insert(0);
        if token >= *h {
            *h = token;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_lower_tokens_per_name() {
        let s = FencedStore::default();
        assert!(s.write(0, Some(5)));
        assert!(s.write(0, Some(5)));
        assert!(!s.write(0, Some(4)));
        assert!(s.write(1, Some(1)));
        assert!(s.write(0, None));
    }
}
