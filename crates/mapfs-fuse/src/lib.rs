//! FUSE adapter.
