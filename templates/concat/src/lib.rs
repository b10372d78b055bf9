//! `libconcat_embed.so`: the embedded-mode library of `concat`, the whole
//! of what a file system needs to run inside the application. It must sit
//! beside the `concat` binary (or in `../lib/mapfs/` from it), where `run
//! --embed` looks for the name given to `Registry::embed_library`.

// The file system and its registry, shared with the program.
mod fs;

mapfs_embed::library!(fs::registry());
