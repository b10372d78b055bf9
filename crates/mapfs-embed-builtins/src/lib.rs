//! `libmapfs_embed_builtins.so`, the library `mapfs run --embed` preloads:
//! the embedded mode of [`mapfs_embed`] serving the built-in file systems
//! that can run inside the application ([`mapfs_registry::embeddable`]).
//!
//! It links only those (passthrough and plfs), not every built-in: each
//! process of an embedded job loads this library, and what it does not
//! link it does not map and relocate (no SQLite, which `pack` and
//! `versions` need).

mapfs_embed::library!(mapfs_registry::embeddable());
