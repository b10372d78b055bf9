//! One error type for every layer: an errno chosen once, in the core, plus a
//! message for logs. Executors only ever turn it into a number.

use std::fmt;
use std::io;

/// Result alias used across mapfs.
pub type Result<T> = std::result::Result<T, Error>;

/// An errno-carrying error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    errno: i32,
    context: Option<String>,
}

impl Error {
    /// An error with this errno value (e.g. `libc::ENOENT`).
    pub fn from_errno(errno: i32) -> Self {
        Error {
            errno,
            context: None,
        }
    }

    /// Adds a human-readable note shown in logs (the errno is unchanged).
    pub fn context(mut self, msg: impl Into<String>) -> Self {
        self.context = Some(msg.into());
        self
    }

    /// Says which step failed, keeping what the error already says:
    /// `"{step}: {context}"`.
    pub fn during(mut self, step: &str) -> Self {
        self.context = Some(match self.context.take() {
            Some(c) => format!("{step}: {c}"),
            None => step.to_string(),
        });
        self
    }

    /// The errno the caller of the file system sees.
    pub fn errno(&self) -> i32 {
        self.errno
    }

    /// `ENOENT`.
    pub fn not_found() -> Self {
        Self::from_errno(libc::ENOENT)
    }
    /// `EINVAL`.
    pub fn invalid() -> Self {
        Self::from_errno(libc::EINVAL)
    }
    /// `ENOSYS`: the file system does not implement the operation.
    pub fn not_implemented() -> Self {
        Self::from_errno(libc::ENOSYS)
    }
    /// `EIO`.
    pub fn io() -> Self {
        Self::from_errno(libc::EIO)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let desc = io::Error::from_raw_os_error(self.errno);
        match &self.context {
            Some(c) => write!(f, "{c}: {desc}"),
            None => write!(f, "{desc}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<io::Error> for Error {
    fn from(e: io::Error) -> Self {
        match e.raw_os_error() {
            Some(n) => Error::from_errno(n),
            None => Error::io().context(e.to_string()),
        }
    }
}

impl From<rustix::io::Errno> for Error {
    fn from(e: rustix::io::Errno) -> Self {
        Error::from_errno(e.raw_os_error())
    }
}

impl From<Error> for io::Error {
    fn from(e: Error) -> Self {
        io::Error::from_raw_os_error(e.errno)
    }
}
