//! The clock shim (`shim/clock.c`, built by `build.rs`), preloaded into a process the test
//! starts: [`StepFile`] steps its time of day, [`skew_monotonic`] makes its monotonic clocks
//! run at a wrong rate. See the C file's header for why not libfaketime. It cannot reach a Go
//! binary such as etcd, which reads the clock without libc.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::process::Command;
use std::time::Duration;

use conformance_tests::ClockStep;

/// The shim, built by `build.rs`.
const SHIM: &str = env!("DISTLOCK_CLOCK_SHIM");

pub(crate) fn shim() -> Result<&'static str, String> {
    if std::path::Path::new(SHIM).is_file() {
        Ok(SHIM)
    } else {
        Err(format!(
            "the clock shim {SHIM} was not built (see the build warning of test-support: it \
             needs a C compiler)"
        ))
    }
}

/// Makes `cmd` run with its monotonic clocks `ppm` parts per million fast (negative: slow),
/// counted from its start; its time of day is left alone. Its children inherit the fault.
///
/// # Errors
/// The shim was not built.
pub fn skew_monotonic(cmd: &mut Command, ppm: i64) -> Result<&mut Command, String> {
    Ok(cmd
        .env("LD_PRELOAD", shim()?)
        .env("DISTLOCK_CLOCK_MONO_PPM", ppm.to_string()))
}

/// The step of one process's time of day, which it reads through the shim: a file of the
/// test's own, in a directory that outlives the process.
#[derive(Debug)]
pub struct StepFile {
    path: std::path::PathBuf,
    file: File,
}

impl StepFile {
    /// A step file `name` in `dir`, at no step.
    ///
    /// # Errors
    /// It cannot be created or written.
    pub fn new(dir: &std::path::Path, name: &str) -> io::Result<StepFile> {
        let path = dir.join(name);
        let file = File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)?;
        let step = StepFile { path, file };
        step.set(ClockStep::Ahead(Duration::ZERO))?;
        Ok(step)
    }

    /// Makes `cmd` read its time of day through this file, running `ppm` parts per million
    /// fast (negative: slow) from its start besides.
    ///
    /// # Errors
    /// The shim was not built.
    pub fn apply<'c>(&self, cmd: &'c mut Command, ppm: i64) -> Result<&'c mut Command, String> {
        Ok(cmd
            .env("LD_PRELOAD", shim()?)
            .env("DISTLOCK_CLOCK_FILE", &self.path)
            .env("DISTLOCK_CLOCK_PPM", ppm.to_string()))
    }

    /// Moves the process's time of day to the real time plus `step`, at once (it replaces the
    /// previous step). Not confirmed: [`ClockedServer::set_step`](crate::clock::ClockedServer::set_step)
    /// asks the server.
    ///
    /// # Errors
    /// The file cannot be written.
    pub fn set(&self, step: ClockStep) -> io::Result<()> {
        // The step and its complement, as the shim reads them (a torn read fails its check).
        let ns = step.nanos();
        let mut pair = [0u8; 16];
        pair[..8].copy_from_slice(&ns.to_le_bytes());
        pair[8..].copy_from_slice(&(!ns).to_le_bytes());
        self.file.write_all_at(&pair, 0)
    }
}
