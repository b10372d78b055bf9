//! The built-in mapfs file systems, one module per mapping pattern, each
//! written only against the public API of the `mapfs` crate.

#![warn(missing_docs)]

pub mod passthrough;
pub mod plfs;

use std::path::Path;
use std::sync::Arc;

use mapfs::{Error, FileSystem, Result};

/// Names of the built-in file systems, for `mapfs mount FS ...`.
pub const NAMES: &[&str] = &["passthrough", "plfs"];

/// Builds the built-in file system `name` over the backing directory.
pub fn build(name: &str, backing: &Path) -> Result<Arc<dyn FileSystem>> {
    match name {
        "passthrough" => Ok(Arc::new(passthrough::Passthrough::new(backing)?)),
        "plfs" => Ok(Arc::new(plfs::Plfs::new(backing)?)),
        _ => Err(Error::invalid().context(format!(
            "unknown file system {name:?} (built in: {})",
            NAMES.join(", ")
        ))),
    }
}
