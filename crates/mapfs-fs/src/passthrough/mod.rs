//! `passthrough`: mirrors a directory, 1-to-1.
use std::path::Path;

use mapfs::{Attr, Ctx, FileSystem, Result};

/// Mirror of a backing directory.
pub struct Passthrough {}

impl Passthrough {
    /// Opens the backing directory.
    pub fn new(backing: &Path) -> Result<Self> {
        let _ = backing;
        todo!()
    }
}

impl FileSystem for Passthrough {
    fn getattr(&self, _ctx: &Ctx, _path: &Path) -> Result<Attr> {
        todo!()
    }
}
