//! The descriptor a Spiel client hands over, and writing to it without ever blocking for long.
//!
//! The client's descriptor stays the client's: its file status flags are never changed. The fd a client
//! passes shares its *file description* with the client's own copy, so setting `O_NONBLOCK` on it would
//! switch the client's copy too (a shell's stdout would then fail with `EAGAIN`). Instead:
//! - a pipe or FIFO is opened again through `/proc/self/fd/N`, which gives the daemon a file description of
//!   its own on the same pipe, non-blocking from the start; the client's fd is closed;
//! - a stream socket is written with `send(MSG_DONTWAIT)`, which does not block whatever the flags say.
//!
//! Anything else (a regular file, `/dev/null`, a terminal, a datagram socket) is refused: it never pushes
//! back, so a stream into it would be generated at full speed, taking the CPU from every other client, and
//! nobody plays it at the pace it is made.

use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use crate::pace::Pace;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Pipe,
    Socket,
}

/// A Spiel client's pipe or stream socket, held by the daemon.
#[derive(Debug)]
pub struct ClientFd {
    fd: OwnedFd,
    kind: Kind,
}

/// Why a descriptor cannot take a Spiel stream; the message is for the client.
fn refuse(what: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, what.to_string())
}

impl ClientFd {
    /// Checks the client's descriptor and takes it: a pipe or FIFO open for writing (reopened as a file
    /// description of the daemon's own), or a connected stream socket. Anything else is refused with a
    /// message that says why.
    pub fn new(fd: OwnedFd) -> io::Result<Self> {
        let raw = fd.as_raw_fd();
        // SAFETY: fstat fills the zeroed struct it is given; the fd is valid while `fd` lives.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        if unsafe { libc::fstat(raw, &mut st) } < 0 {
            return Err(io::Error::last_os_error());
        }
        match st.st_mode & libc::S_IFMT {
            libc::S_IFIFO => {
                // SAFETY: fcntl with integer arguments on a valid fd.
                let flags = unsafe { libc::fcntl(raw, libc::F_GETFL) };
                if flags < 0 {
                    return Err(io::Error::last_os_error());
                }
                if flags & libc::O_ACCMODE == libc::O_RDONLY {
                    return Err(refuse(
                        "the Spiel descriptor is the read end of its pipe; pass the write end",
                    ));
                }
                let path = std::ffi::CString::new(format!("/proc/self/fd/{raw}"))
                    .expect("no NUL in a path of digits");
                // SAFETY: a NUL-terminated path; the result is checked and owned below.
                let own = unsafe {
                    libc::open(
                        path.as_ptr(),
                        libc::O_WRONLY | libc::O_NONBLOCK | libc::O_CLOEXEC,
                    )
                };
                if own < 0 {
                    let e = io::Error::last_os_error();
                    return Err(match e.raw_os_error() {
                        // A FIFO opened for writing with nobody reading.
                        Some(libc::ENXIO) => refuse("nobody reads the Spiel pipe"),
                        _ => io::Error::new(
                            e.kind(),
                            format!("cannot open the Spiel pipe for writing: {e}"),
                        ),
                    });
                }
                // SAFETY: `own` is a new descriptor that nothing else owns.
                let own = unsafe { OwnedFd::from_raw_fd(own) };
                // The client's fd is closed here: the daemon writes through its own description only.
                drop(fd);
                Ok(ClientFd {
                    fd: own,
                    kind: Kind::Pipe,
                })
            }
            libc::S_IFSOCK => {
                let mut kind: libc::c_int = 0;
                let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
                // SAFETY: getsockopt writes at most `len` bytes into `kind`.
                let got = unsafe {
                    libc::getsockopt(
                        raw,
                        libc::SOL_SOCKET,
                        libc::SO_TYPE,
                        (&mut kind as *mut libc::c_int).cast(),
                        &mut len,
                    )
                };
                if got < 0 {
                    return Err(io::Error::last_os_error());
                }
                if kind != libc::SOCK_STREAM {
                    return Err(refuse(
                        "the Spiel descriptor is a socket that is not a stream; pass a pipe",
                    ));
                }
                Ok(ClientFd {
                    fd,
                    kind: Kind::Socket,
                })
            }
            mode => Err(refuse(format!(
                "the Spiel descriptor must be a pipe or a stream socket, not {}: it would never say when \
                 it is full, and the stream would be made faster than anyone hears it",
                match mode {
                    libc::S_IFREG => "a regular file",
                    libc::S_IFCHR => "a character device",
                    libc::S_IFBLK => "a block device",
                    libc::S_IFDIR => "a directory",
                    _ => "something else",
                }
            ))),
        }
    }

    /// Writes what fits now; `WouldBlock` when nothing does.
    fn write_now(&self, buf: &[u8]) -> io::Result<usize> {
        let fd = self.fd.as_raw_fd();
        let n = match self.kind {
            // SAFETY: writes at most `buf.len()` bytes from `buf` to a valid fd, which is non-blocking
            // (a file description of the daemon's own).
            Kind::Pipe => unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) },
            // SAFETY: as above; MSG_DONTWAIT makes this one call non-blocking without touching the flags
            // shared with the client, MSG_NOSIGNAL turns a closed peer into EPIPE.
            Kind::Socket => unsafe {
                libc::send(
                    fd,
                    buf.as_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                )
            },
        };
        if n < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(n as usize)
        }
    }

    /// Bytes written that the client has not read yet.
    fn unread(&self) -> u64 {
        let request = match self.kind {
            Kind::Pipe => libc::FIONREAD,
            // For a socket: bytes sent and not yet taken by the peer (Linux's SIOCOUTQ).
            Kind::Socket => libc::TIOCOUTQ,
        };
        let mut n: libc::c_int = 0;
        // SAFETY: the ioctl writes one int into `n`.
        let got = unsafe { libc::ioctl(self.fd.as_raw_fd(), request, &mut n) };
        if got < 0 {
            0
        } else {
            n.max(0) as u64
        }
    }
}

impl AsFd for ClientFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl AsRawFd for ClientFd {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.fd.as_raw_fd()
    }
}

/// How long one wait for room lasts before the stop flag and the pace are looked at again.
const POLL_SLICE_MS: i32 = 20;

/// Writing a stream into a client's descriptor without ever blocking for long, at the pace the client reads:
/// a write waits for room in slices, gives up within a slice once `stopped` says so, and asks `give_up`
/// (with how long the client has been behind) whenever the client has fallen behind real time by more than
/// its pace allows; `true` ends the stream with `TimedOut`. One client that stops reading thus holds up
/// nobody, not even a stop.
pub struct ClientPipe<'a> {
    fd: &'a ClientFd,
    pace: Pace,
    stopped: &'a (dyn Fn() -> bool + Sync),
    give_up: &'a (dyn Fn(Duration) -> bool + Sync),
}

impl<'a> ClientPipe<'a> {
    pub fn new(
        fd: &'a ClientFd,
        pace: Pace,
        stopped: &'a (dyn Fn() -> bool + Sync),
        give_up: &'a (dyn Fn(Duration) -> bool + Sync),
    ) -> Self {
        ClientPipe {
            fd,
            pace,
            stopped,
            give_up,
        }
    }

    /// Waits up to one slice for room.
    fn wait_writable(&self) {
        let mut poll = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLOUT,
            revents: 0,
        };
        // SAFETY: one valid pollfd; the fd outlives the call.
        unsafe { libc::poll(&mut poll, 1, POLL_SLICE_MS) };
    }

    /// An error when the client is behind and `give_up` says so.
    fn check_pace(&mut self) -> io::Result<()> {
        let taken = self.pace.written().saturating_sub(self.fd.unread());
        if let Some(behind_for) = self.pace.behind(taken, Instant::now()) {
            if (self.give_up)(behind_for) {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "it read {:.1} s behind real time (allowed {:.2} s)",
                        self.pace.lag_seconds(taken),
                        self.pace.allowance().as_secs_f64()
                    ),
                ));
            }
        }
        Ok(())
    }
}

impl Write for ClientPipe<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        loop {
            if (self.stopped)() {
                return Err(io::Error::other("stopped"));
            }
            self.check_pace()?;
            match self.fd.write_now(buf) {
                Ok(n) => {
                    self.pace.wrote(n, Instant::now());
                    return Ok(n);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() != io::ErrorKind::WouldBlock => return Err(e),
                Err(_) => self.wait_writable(),
            }
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    const RATE: f64 = 48_000.0;

    fn flags(fd: &impl AsRawFd) -> i32 {
        // SAFETY: F_GETFL on a valid fd.
        unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) }
    }

    #[test]
    fn a_pipe_is_written_through_a_description_of_its_own() {
        let (mut reader, writer) = std::io::pipe().unwrap();
        // The client keeps a copy of its write end (one file description with the one it passes).
        let kept = writer.try_clone().unwrap();
        let before = flags(&kept);
        assert_eq!(before & libc::O_NONBLOCK, 0);
        let fd = ClientFd::new(OwnedFd::from(writer)).unwrap();
        assert_eq!(flags(&kept), before, "the client's flags changed");
        assert_ne!(flags(&fd) & libc::O_NONBLOCK, 0);
        let never = || false;
        let patient = |_: Duration| false;
        let mut pipe = ClientPipe::new(
            &fd,
            Pace::new(RATE, Duration::from_secs(1)),
            &never,
            &patient,
        );
        pipe.write_all(b"0.01abc").unwrap();
        drop(fd);
        drop(kept);
        let mut all = Vec::new();
        reader.read_to_end(&mut all).unwrap();
        assert_eq!(all, b"0.01abc");
    }

    #[test]
    fn a_socket_is_written_without_touching_its_flags() {
        let (a, mut b) = std::os::unix::net::UnixStream::pair().unwrap();
        let kept = a.try_clone().unwrap();
        let before = flags(&kept);
        let fd = ClientFd::new(OwnedFd::from(a)).unwrap();
        let never = || false;
        let always = |_: Duration| true;
        let pace = Pace::new(RATE, Duration::from_millis(100));
        let mut pipe = ClientPipe::new(&fd, pace, &never, &always);
        // Nobody reads: the socket fills, the write waits (without blocking) and gives up.
        let e = pipe.write_all(&vec![7u8; 16 << 20]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut, "{e}");
        assert_eq!(flags(&kept), before, "the client's flags changed");
        drop(fd);
        drop(kept);
        let mut got = Vec::new();
        b.read_to_end(&mut got).unwrap();
        assert!(got.len() > 1000 && got.iter().all(|&x| x == 7));
    }

    #[test]
    fn files_devices_read_ends_and_datagrams_are_refused() {
        let null = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/null")
            .unwrap();
        let e = ClientFd::new(OwnedFd::from(null)).unwrap_err();
        assert!(e.to_string().contains("character device"), "{e}");
        let file = tempfile_in_tmp();
        let e = ClientFd::new(OwnedFd::from(file)).unwrap_err();
        assert!(e.to_string().contains("regular file"), "{e}");
        let (reader, _writer) = std::io::pipe().unwrap();
        let e = ClientFd::new(OwnedFd::from(reader)).unwrap_err();
        assert!(e.to_string().contains("read end"), "{e}");
        let (d, _) = std::os::unix::net::UnixDatagram::pair().unwrap();
        let e = ClientFd::new(OwnedFd::from(d)).unwrap_err();
        assert!(e.to_string().contains("not a stream"), "{e}");
    }

    fn tempfile_in_tmp() -> std::fs::File {
        let path = std::env::temp_dir().join(format!("kazeia-spiel-test-{}", std::process::id()));
        let file = std::fs::File::create(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        file
    }

    #[test]
    fn a_reader_that_falls_behind_is_given_up_and_a_stop_cuts_the_wait_short() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let (reader, writer) = std::io::pipe().unwrap();
        let fd = ClientFd::new(OwnedFd::from(writer)).unwrap();
        let never = || false;
        let always = |_: Duration| true;
        // 1 MiB at 48 kB/s with a 300 ms allowance: given up ~300 ms after the first byte.
        let mut pipe = ClientPipe::new(
            &fd,
            Pace::new(RATE, Duration::from_millis(300)),
            &never,
            &always,
        );
        let chunk = vec![0u8; 1 << 20];
        let start = Instant::now();
        let e = pipe.write_all(&chunk).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        let waited = start.elapsed();
        assert!(
            waited >= Duration::from_millis(300) && waited < Duration::from_secs(2),
            "{waited:?}"
        );
        assert!(e.to_string().contains("behind real time"), "{e}");
        // A judge that lets it wait: a stop still ends the write within a slice.
        let stop = AtomicBool::new(false);
        let stopped = || stop.load(Ordering::SeqCst);
        let patient = |_: Duration| false;
        let mut pipe = ClientPipe::new(
            &fd,
            Pace::new(RATE, Duration::from_millis(300)),
            &stopped,
            &patient,
        );
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(500));
                stop.store(true, Ordering::SeqCst);
            });
            let start = Instant::now();
            assert!(pipe.write_all(&chunk).is_err());
            let took = start.elapsed();
            assert!(
                took >= Duration::from_millis(450) && took < Duration::from_secs(2),
                "{took:?}"
            );
        });
        drop(reader);
        let mut pipe = ClientPipe::new(
            &fd,
            Pace::new(RATE, Duration::from_millis(300)),
            &never,
            &patient,
        );
        assert_eq!(
            pipe.write_all(b"x").unwrap_err().kind(),
            io::ErrorKind::BrokenPipe
        );
    }
}
