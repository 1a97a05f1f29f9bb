//! A pipe that wakes an event loop (asyncio's, through `_Waker`) without the GIL: the engine
//! writes a byte when a request the loop awaits has news; the loop watches the read end.
//!
//! The pipe lives as long as its loop's handle: requests hold it weakly and keep it open only
//! while they write, so a closed loop frees its pipe and a closed and reused descriptor number
//! can never receive the byte.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// The two ends of a non-blocking pipe.
pub struct WakePipe {
    read: OwnedFd,
    write: OwnedFd,
}

impl WakePipe {
    pub fn new() -> std::io::Result<Self> {
        let mut fds = [0; 2];
        // SAFETY: `fds` has room for the two descriptors pipe2 writes.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: pipe2 succeeded, so both descriptors are open and owned by no one else.
        Ok(unsafe {
            Self {
                read: OwnedFd::from_raw_fd(fds[0]),
                write: OwnedFd::from_raw_fd(fds[1]),
            }
        })
    }

    /// Makes the read end readable. A full pipe is already readable: the byte is not needed.
    pub fn wake(&self) {
        let byte = 1u8;
        // SAFETY: writes one byte from a live local to a descriptor this value owns.
        let _ = unsafe { libc::write(self.write.as_raw_fd(), std::ptr::from_ref(&byte).cast(), 1) };
    }

    /// Empties the pipe (after it woke the loop).
    pub fn drain(&self) {
        let mut buffer = [0u8; 256];
        // SAFETY: reads into a live local buffer of the given length from a descriptor this
        // value owns; non-blocking, so the loop ends when the pipe is empty.
        while unsafe { libc::read(self.read.as_raw_fd(), buffer.as_mut_ptr().cast(), buffer.len()) } > 0 {}
    }

    /// The descriptor to watch for reading.
    pub fn fileno(&self) -> RawFd {
        self.read.as_raw_fd()
    }
}
