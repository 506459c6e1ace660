//! Builds the wall-clock shim (`shim/clock.c`, see `src/clock.rs`) into a shared library that
//! tests preload into servers they start; its path reaches the crate as `DISTLOCK_CLOCK_SHIM`.
//! The C compiler is the one Rust already links with on Linux (`cc`, or `$CC`).

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=shim/clock.c");
    println!("cargo:rerun-if-env-changed=CC");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").unwrap_or_default());
    let lib = out.join("libdistlock_clock.so");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&cc)
        .args(["-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-o"])
        .arg(&lib)
        .arg("shim/clock.c")
        .status();
    match status {
        Ok(s) if s.success() => {}
        // Not fatal: only the clock tests need it, and they say so when it is missing.
        other => println!("cargo:warning=could not build shim/clock.c with {cc}: {other:?}"),
    }
    println!("cargo:rustc-env=DISTLOCK_CLOCK_SHIM={}", lib.display());
}
