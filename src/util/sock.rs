//! Non-consuming, non-blocking socket checks: one `recv(MSG_PEEK | MSG_DONTWAIT)` tells whether
//! a connection has bytes pending, has been closed by its peer, or is quiet.
//!
//! Owns: `peek` and `Peeked`. Must not: consume bytes, block, or keep file descriptors (callers
//! pass the fd of a socket they hold for the duration of the call). Works the same under both
//! drivers: it is a plain syscall on the socket, outside the ring / epoll set.

use std::os::fd::RawFd;

use nix::errno::Errno;
use nix::sys::socket::{recv, MsgFlags};

/// What a peek saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peeked {
    /// Nothing to read and no close: the connection is quiet.
    Quiet,
    /// At least one byte is waiting to be read (left in the socket).
    Data,
    /// The peer closed (EOF) or the socket reports an error (reset, ...).
    Closed,
}

/// One non-blocking `MSG_PEEK` of at most one byte on `fd`.
pub fn peek(fd: RawFd) -> Peeked {
    let mut b = [0u8; 1];
    loop {
        return match recv(fd, &mut b, MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT) {
            Ok(0) => Peeked::Closed,
            Ok(_) => Peeked::Data,
            Err(Errno::EAGAIN) => Peeked::Quiet,
            Err(Errno::EINTR) => continue,
            Err(_) => Peeked::Closed,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsRawFd;

    #[test]
    fn quiet_data_closed() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut s, _) = l.accept().unwrap();
        assert_eq!(peek(c.as_raw_fd()), Peeked::Quiet);
        s.write_all(b"x").unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert_eq!(peek(c.as_raw_fd()), Peeked::Data);
        assert_eq!(peek(c.as_raw_fd()), Peeked::Data, "peek does not consume");
        let c2 = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s2, _) = l.accept().unwrap();
        drop(s2);
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert_eq!(peek(c2.as_raw_fd()), Peeked::Closed);
    }
}
