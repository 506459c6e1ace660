//! `FileConfig`: the directory that holds the lock files.

use std::fmt;
use std::path::{Path, PathBuf};

use lock_core::{Error, Result};

/// The backend's name, as [`DistributedLock::backend`](lock_core::DistributedLock::backend)
/// and errors give it.
pub(crate) const BACKEND: &str = "file";

/// Where a [`FileLock`](crate::FileLock) keeps its lock files: `<dir>/<name>.lock`.
///
/// ```
/// use lock_file::FileConfig;
/// let c = FileConfig::from_url("file:///var/lock/myapp")?;
/// assert_eq!(c.dir(), std::path::Path::new("/var/lock/myapp"));
/// assert_eq!(c.to_string(), "file:///var/lock/myapp");
/// assert!(FileConfig::from_url("file://elsewhere/x").is_err());
/// assert!(FileConfig::from_url("file:///x?mode=1").is_err());
/// // Escapes mean what they encode; a raw tab or newline, or a space at either end, which URL
/// // parsing would drop, is refused instead of naming another directory.
/// assert_eq!(FileConfig::from_url("file:///var/lock/my%20app")?.dir(), std::path::Path::new("/var/lock/my app"));
/// assert!(FileConfig::from_url("file:///var/lo\nck").is_err());
/// assert!(FileConfig::from_url("file:///var/lock\t").is_err());
/// assert!(FileConfig::from_url("file:///var/lock ").is_err());
/// # Ok::<(), lock_core::Error>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct FileConfig {
    dir: PathBuf,
}

impl FileConfig {
    /// Lock files in `dir` (created when the lock connects, if missing).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        FileConfig { dir: dir.into() }
    }

    /// Parses `file:///absolute/dir`: a local directory, no host other than `localhost`, no
    /// query, no fragment.
    pub fn from_url(url: &str) -> Result<Self> {
        // URL parsing drops tabs and newlines anywhere and spaces at the ends: refused here,
        // or the lock would live in a directory other than the one named.
        if url.chars().any(char::is_control) || url.trim() != url {
            return Err(Error::config(
                "file URL: a control character, or a space at either end (percent-encode it: \
                 %09 %0A %20)",
            ));
        }
        let u = url::Url::parse(url)
            .map_err(|e| Error::config_with(format!("file URL: {e} (expected file:///dir)"), e))?;
        let local = matches!(u.host_str(), None | Some("") | Some("localhost"));
        if u.scheme() != "file" || !local || u.query().is_some() || u.fragment().is_some() {
            return Err(Error::config(
                "a file URL is file:///absolute/dir (a local directory, no query)",
            ));
        }
        let dir = u
            .to_file_path()
            .map_err(|()| Error::config("file URL: not an absolute local path (file:///dir)"))?;
        Ok(FileConfig { dir })
    }

    /// The lock directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl fmt::Debug for FileConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FileConfig")
            .field("dir", &self.dir)
            .finish()
    }
}

impl fmt::Display for FileConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "file://{}", self.dir.display())
    }
}
