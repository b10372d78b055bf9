//! `libconcat_embed.so`: the `concat` example's embedded-mode library, the
//! whole of what a file system needs to run inside the application. Built
//! beside the `concat` binary, whose `run --embed` preloads it (the name is
//! given to `Registry::embed_library` in `concat.rs`).

// The file system and its registry, shared with the `concat` program (its
// `main` is not used here).
#[allow(dead_code)]
#[path = "concat.rs"]
mod concat;

mapfs_embed::library!(concat::registry());
