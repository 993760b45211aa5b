//! The descriptor a Spiel client hands over stays the client's (issue 40, item 5), on a private `dbus-daemon`
//! with `kazeiad` on the tiny fixture model:
//! - after a stream into a pipe or a socket, the client's own copy has the flags it had (no `O_NONBLOCK`);
//! - `/dev/null`, a regular file or the read end of a pipe is refused with a clear error, and the daemon
//!   goes on serving.

use std::os::fd::{AsFd, AsRawFd};
use std::time::Duration;

use crate::common::*;

fn status_flags(fd: &impl AsRawFd) -> i32 {
    // SAFETY: F_GETFL on a valid fd.
    unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_clients_descriptor_keeps_its_flags_and_only_pipes_and_sockets_are_taken() {
    let mut daemon = TestDaemon::null("client-fds", "[generation]\nmax_frames = 6\n");
    let (connection, api) = client(&daemon.bus).await;
    let mut finishes = Finishes::new(&api).await;

    // A pipe whose write end the client keeps a copy of (as a shell keeps its stdout).
    let (reader, writer) = std::io::pipe().unwrap();
    let before = status_flags(&writer);
    assert_eq!(before & libc::O_NONBLOCK, 0);
    synthesize_to(&connection, writer.as_fd(), "Into a pipe.", false)
        .await
        .unwrap();
    let id = finishes.any_with("done", Duration::from_secs(20)).await;
    let after = status_flags(&writer);
    assert_eq!(
        after, before,
        "the client's pipe flags changed: {before:#o} → {after:#o}"
    );
    drop(writer);
    let heard = tokio::task::spawn_blocking(move || read_stream(reader, None))
        .await
        .unwrap();
    assert!(!heard.is_empty(), "stream {id} had audio");

    // A stream socket, the client keeping its end's twin.
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
    let before = status_flags(&theirs);
    synthesize_to(&connection, theirs.as_fd(), "Into a socket.", false)
        .await
        .unwrap();
    finishes.any_with("done", Duration::from_secs(20)).await;
    assert_eq!(
        status_flags(&theirs),
        before,
        "the client's socket flags changed"
    );
    drop(theirs);
    let heard = tokio::task::spawn_blocking(move || read_stream(ours, None))
        .await
        .unwrap();
    assert!(!heard.is_empty());

    // What never says it is full is refused, with the reason.
    let null = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/null")
        .unwrap();
    let file = std::fs::File::create(daemon.dir.path().join("out.spiel")).unwrap();
    let (read_end, _write_end) = std::io::pipe().unwrap();
    for (what, fd, expected) in [
        ("/dev/null", null.as_fd(), "character device"),
        ("a regular file", file.as_fd(), "regular file"),
        ("a pipe's read end", read_end.as_fd(), "read end"),
    ] {
        let e = synthesize_to(&connection, fd, "Nobody hears this.", false)
            .await
            .expect_err(what)
            .to_string();
        assert!(
            e.contains("InvalidArgs") && e.contains(expected),
            "{what}: {e}"
        );
    }
    assert_eq!(
        std::fs::metadata(daemon.dir.path().join("out.spiel"))
            .unwrap()
            .len(),
        0,
        "nothing was written to the file"
    );

    // The daemon goes on serving.
    let samples = spiel(&connection, "Still here.").await.unwrap();
    assert!(!samples.is_empty());
    daemon.service.check_running();
}
