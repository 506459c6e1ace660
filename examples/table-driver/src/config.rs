//! `TableConfig`: which table a client uses, from a `table://NAME` URL.

use lock_core::{Error, Result};

/// The backend's name, as [`DistributedLock::backend`](lock_core::DistributedLock::backend)
/// and errors give it.
pub(crate) const BACKEND: &str = "table";

/// Which table a client uses: one per name in this process, so two clients of one URL see
/// each other's locks.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TableConfig {
    table: String,
}

impl TableConfig {
    /// The table called `table`.
    pub fn new(table: impl Into<String>) -> Self {
        TableConfig {
            table: table.into(),
        }
    }

    /// From `table://[NAME]`; anything else is `Error::Config`.
    ///
    /// ```
    /// let c = table_driver::TableConfig::from_url("table://jobs")?;
    /// assert_eq!(c.table(), "jobs");
    /// assert!(table_driver::TableConfig::from_url("table://a/b").is_err());
    /// # Ok::<(), lock_core::Error>(())
    /// ```
    pub fn from_url(url: &str) -> Result<Self> {
        url.strip_prefix("table://")
            .filter(|n| !n.contains(['/', '?', '@', '#']))
            .map(TableConfig::new)
            .ok_or_else(|| Error::config("a table URL is table://[NAME]"))
    }

    /// The table's name.
    pub fn table(&self) -> &str {
        &self.table
    }
}
