//! What distlock waits for, said on a terminal while the wait lasts: a line rewritten every
//! second (`waiting for lock demo on file (3s)`, `connecting to redis://h:6379 (2s)`), so a
//! silent server or a held lock is never a silent hang. Nothing when stderr is not a terminal:
//! logs and cron mail stay clean.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;

use crate::exit::to_stderr;

/// A progress line, from a second after it starts until [`Progress::done`] (or drop).
pub(crate) struct Progress {
    ticker: Option<JoinHandle<()>>,
    start: Instant,
}

impl Progress {
    /// Says `what` (with the seconds waited) each second from the first on, if stderr is a
    /// terminal and `show` allows.
    pub(crate) fn start(what: String, show: bool) -> Self {
        let start = Instant::now();
        let ticker = (show && std::io::stderr().is_terminal()).then(|| {
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    let waited = start.elapsed().as_secs();
                    to_stderr(&format!("\rdistlock: {what} ({waited}s)"));
                }
            })
        });
        Progress { ticker, start }
    }

    /// The wait is over: ends the line, if one was written.
    pub(crate) fn done(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        if let Some(t) = self.ticker.take() {
            t.abort();
            if self.start.elapsed() >= Duration::from_secs(1) {
                to_stderr("\n");
            }
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.stop();
    }
}
