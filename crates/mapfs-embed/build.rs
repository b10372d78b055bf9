// The link options of the preload shim, for the same reason: every
// process of an embedded job loads the library too (the unwinder linked in
// statically rather than libgcc_s.so.1; see that file). Declared by this
// rlib, they reach every cdylib made with `mapfs_embed::library!`.
include!("../mapfs-preload/build.rs");
