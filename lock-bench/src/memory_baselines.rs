//! The in-process floor: one `tokio::sync::Mutex` per name.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;

use crate::subject::{Guard, Subject};

/// Floor for in-process locking: one `tokio::sync::Mutex` per name, FIFO like the memory
/// driver, no TTL, no tokens.
#[derive(Default)]
pub(crate) struct TokioMutex {
    names: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

struct TokioGuard(#[allow(dead_code)] tokio::sync::OwnedMutexGuard<()>);

#[async_trait]
impl Guard for TokioGuard {
    async fn unlock(self: Box<Self>) -> Result<(), String> {
        Ok(())
    }
}

#[async_trait]
impl Subject for TokioMutex {
    fn label(&self) -> String {
        "baseline: tokio Mutex per name".into()
    }
    async fn lock(&self, name: &str) -> Result<Box<dyn Guard>, String> {
        let m = {
            let mut names = self.names.lock().map_err(|e| e.to_string())?;
            names.entry(name.to_string()).or_default().clone()
        };
        Ok(Box::new(TokioGuard(m.lock_owned().await)))
    }
}
