// The link options of the preload shim, for the same reason: every
// process of an embedded job loads this library too (the unwinder linked
// in statically rather than libgcc_s.so.1; see that file).
include!("../mapfs-preload/build.rs");
