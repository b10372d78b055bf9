//! `libmapfs_embed_full.so`, the library `mapfs run --embed` preloads when
//! a job embeds `versions`: the embedded mode of [`mapfs_embed`] serving
//! every built-in file system that can run inside the application
//! ([`mapfs_registry::embeddable_full`]).
//!
//! It links SQLite (the versions store's index), which the lean
//! `libmapfs_embed_builtins.so` leaves out so that jobs embedding only
//! `passthrough` and `plfs` do not map and relocate it in every process.

mapfs_embed::library!(mapfs_registry::embeddable_full());
