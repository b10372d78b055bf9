//! `libunion_embed.so`: the `union` example's embedded-mode library (see
//! `templates/concat/src/lib.rs`, which explains the pattern). `union run --embed
//! union:UPPER:LOWER:/u -- PROGRAM` preloads it.

// The file system and its registry, shared with the `union` program (its
// `main` is not used here).
#[allow(dead_code)]
#[path = "union.rs"]
mod union;

mapfs_embed::library!(union::registry());
