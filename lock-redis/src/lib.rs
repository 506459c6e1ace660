//! The `redis` driver for distlock.
//!
//! This crate is a placeholder: the driver lands with its own issue. It compiles so the workspace
//! layout (and every path that refers to it) is stable from the first commit.

pub use lock_core;
