//! `libmapfs_preload.so`: the preload executor (see DESIGN.md). Not built yet;
//! issue 3 tracks it. The crate exists so the workspace layout is final.
