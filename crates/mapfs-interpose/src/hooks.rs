//! Declaring hooks: the exported C symbol that replaces a libc function,
//! and [`Real`], the pointer to the next definition of that symbol (the
//! one the hook stands in front of: libc's, or another interposer's loaded
//! after this library).
//!
//! [`hooks!`](crate::hooks!) generates, for each entry, the
//! `#[no_mangle] pub unsafe extern "C" fn` and its [`Real`], and one
//! `resolve_all()` that the library's constructor calls: every real
//! function is found before `main`, because a hook first called in a
//! signal handler or a forked child must not run `dlsym` there (it takes
//! the loader's lock, which the interrupted or forking thread may hold).

use std::ffi::{c_void, CStr};
use std::sync::atomic::{AtomicPtr, Ordering};

/// The next definition of a hooked symbol (`dlsym(RTLD_NEXT, name)` from
/// the library that declares it), found once and kept.
pub struct Real {
    ptr: AtomicPtr<c_void>,
    name: &'static CStr,
}

impl Real {
    /// A not-yet-resolved function.
    pub const fn new(name: &'static CStr) -> Self {
        Real {
            ptr: AtomicPtr::new(std::ptr::null_mut()),
            name,
        }
    }

    /// Its address: the next definition of the symbol after the library
    /// this `Real` is in (resolved at the first call, which
    /// `resolve_all()` makes from the constructor). Aborts the process
    /// when there is none: a hook with nothing to call cannot answer.
    #[inline]
    pub fn addr(&self) -> *mut c_void {
        let p = self.ptr.load(Ordering::Relaxed);
        if !p.is_null() {
            return p;
        }
        self.resolve()
    }

    #[cold]
    #[inline(never)]
    fn resolve(&self) -> *mut c_void {
        // SAFETY: dlsym with a NUL-terminated name. `RTLD_NEXT` searches the
        // objects after the one containing the caller: the library that
        // links this crate (each links its own copy).
        let p = unsafe { libc::dlsym(libc::RTLD_NEXT, self.name.as_ptr()) };
        if p.is_null() {
            let stderr = rustix::stdio::stderr();
            let _ = rustix::io::write(stderr, b"mapfs: no next definition of `");
            let _ = rustix::io::write(stderr, self.name.to_bytes());
            let _ = rustix::io::write(stderr, b"` to interpose; aborting\n");
            std::process::abort();
        }
        self.ptr.store(p, Ordering::Relaxed);
        p
    }
}

/// What a hook runs before its body when its table names no prelude.
#[doc(hidden)]
#[inline(always)]
pub fn no_prelude(_name: &'static str) {}

/// Declares hooks. Each entry is
///
/// ```text
/// #[attributes]
/// fn name(arg: Type, ...) -> Ret [as RealFnType] = |real| { body }
/// ```
///
/// and becomes the exported `pub unsafe extern "C" fn name(...) -> Ret`
/// whose body runs with `real` bound to the next definition of `name`, of
/// type `RealFnType` (by default `unsafe extern "C" fn(Type, ...) -> Ret`,
/// the hook's own prototype; a variadic C function names its variadic
/// type here). Attributes (`#[cfg(..)]`) apply to the hook and its
/// resolution. The table may start with `prelude = path::to::function;`:
/// a `fn(&'static str)` every hook calls with its name after binding
/// `real` and before its body.
///
/// Generates `pub(crate) fn resolve_all()`, resolving every hook of the
/// table: call it from the library's constructor. Each hook's [`Real`] is
/// `name::REAL` (a module per hook, at the invocation site).
///
/// The body is that of an `unsafe fn`: under `unsafe_op_in_unsafe_fn`
/// each unsafe operation in it, `real(..)` included, is written in an
/// `unsafe` block of its own.
#[macro_export]
macro_rules! hooks {
    (@realty [$($ty:ty),*] $ret:ty) => { unsafe extern "C" fn($($ty),*) -> $ret };
    (@realty [$($ty:ty),*] $ret:ty, $real_ty:ty) => { $real_ty };
    (
        prelude = $prelude:path;
        $(
            $(#[$m:meta])*
            fn $name:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty $(as $real_ty:ty)? = |$real:ident| $body:block
        )*
    ) => {
        $(
            $(#[$m])*
            #[allow(non_snake_case)]
            mod $name {
                /// The next definition of the symbol.
                pub(super) static REAL: $crate::hooks::Real = $crate::hooks::Real::new(
                    // SAFETY: the literal below is NUL-terminated and has no
                    // interior NUL.
                    unsafe {
                        ::std::ffi::CStr::from_bytes_with_nul_unchecked(
                            concat!(stringify!($name), "\0").as_bytes(),
                        )
                    },
                );
            }

            $(#[$m])*
            #[doc = concat!("The interposed `", stringify!($name), "` (see the module docs).")]
            #[no_mangle]
            pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
                // SAFETY: `REAL` holds the address of the next definition of
                // this very symbol, whose C prototype is the type named here.
                #[allow(unused_variables)]
                let $real: $crate::hooks!(@realty [$($ty),*] $ret $(, $real_ty)?) = unsafe {
                    ::std::mem::transmute::<*mut ::std::ffi::c_void, _>($name::REAL.addr())
                };
                $prelude(stringify!($name));
                $body
            }
        )*

        /// Resolves every hook's real function, from the constructor: a
        /// hook first called in a signal handler or a forked child must
        /// not run `dlsym` there (it takes the loader's lock).
        #[allow(unused_doc_comments)]
        pub(crate) fn resolve_all() {
            $(
                $(#[$m])*
                let _ = $name::REAL.addr();
            )*
        }
    };
    (prelude $($rest:tt)*) => {
        compile_error!("a hook table entry is not `fn name(args) -> Ret [as RealFnType] = |real| { body }`");
    };
    ($($rest:tt)*) => {
        $crate::hooks! { prelude = $crate::hooks::no_prelude; $($rest)* }
    };
}
