use std::mem::align_of;

use crate::ll::fuse_abi as abi;
use crate::session::MAX_WRITE_SIZE;

/// Size of the buffer for reading a request from the kernel. Since the kernel may send
/// up to `MAX_WRITE_SIZE` bytes in a write request, we use that value plus some extra space.
const BUFFER_SIZE: usize = MAX_WRITE_SIZE + 4096;

/// How much of the buffer is touched when it is made: the largest request the
/// kernel sends unless `fs.fuse.max_pages_limit` is raised (256 pages of data,
/// plus the headers).
const PREFAULT_SIZE: usize = 256 * 4096 + 2 * 4096;

/// A buffer that provides an aligned sub-slice for FUSE operations.
///
/// This struct wraps a `Vec<u8>` and provides access to an aligned portion
/// of the buffer, ensuring proper alignment for `fuse_in_header`.
#[derive(Debug)]
pub(crate) struct FuseReadBuf {
    buffer: Vec<u8>,
}

impl FuseReadBuf {
    /// Creates a new `FuseReadBuf` with the default buffer size.
    ///
    /// The actual buffer may be slightly larger to accommodate alignment requirements.
    pub(crate) fn new() -> Self {
        let mut buffer = vec![0; BUFFER_SIZE];
        // The kernel copies a request into this buffer page by page; a page
        // it must fault in while the server has a fatal signal pending fails
        // the copy, and the kernel then ends that request with EIO instead of
        // leaving it for a successor to be sent again (FUSE_NOTIFY_RESEND).
        // Pages already written cannot fault, so a server killed while it
        // reads a request loses nothing. The store of an opaque value cannot
        // be dropped as redundant with the zeroed allocation.
        for page in buffer[..PREFAULT_SIZE.min(BUFFER_SIZE)].chunks_mut(4096) {
            page[0] = std::hint::black_box(0);
        }
        Self { buffer }
    }

    /// Returns a mutable reference to the aligned portion of the buffer.
    pub(crate) fn as_mut(&mut self) -> &mut [u8] {
        let alignment = align_of::<abi::fuse_in_header>();
        let off = alignment - (self.buffer.as_ptr() as usize) % alignment;
        if off == alignment {
            &mut self.buffer
        } else {
            &mut self.buffer[off..]
        }
    }
}
