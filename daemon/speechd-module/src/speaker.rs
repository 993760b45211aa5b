//! One message being spoken: the Spiel stream from the provider, relayed as `705` audio blocks and `700`
//! marks between `701 BEGIN` and exactly one of `702 END` / `703 STOP` / `704 PAUSE`.
//!
//! It runs on its own thread so the command loop keeps reading STOP and PAUSE. Reads wait at most
//! [`POLL_INTERVAL`] at a time, so a STOP is noticed within that even while the provider is still computing.

use std::io::{self, PipeReader, Read};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use kazeia_spiel::{Chunk, EventKind, SpielReader};

use super::log;
use super::output::{Event, Output};
use super::server_audio::BlockBuffer;

pub const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// Requests from the command loop to the speaking thread.
#[derive(Default)]
pub struct Control {
    stop: AtomicBool,
    pause: AtomicBool,
}

impl Control {
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }

    /// Stop at the next `__spd_` mark.
    pub fn pause(&self) {
        self.pause.store(true, Ordering::SeqCst);
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }
}

/// How the audio of one message is relayed.
#[derive(Clone, Copy, Debug)]
pub struct AudioFormat {
    pub sample_rate: u32,
    pub block_samples: usize,
    pub gain: f32,
}

/// The speaking thread of one message.
pub struct Speaker {
    control: Arc<Control>,
    thread: JoinHandle<()>,
}

impl Speaker {
    /// Starts relaying `stream`; `701 BEGIN` is the first thing it writes. `received`: when the message
    /// came, for the latency lines of the debug log.
    pub fn start(
        stream: PipeReader,
        format: AudioFormat,
        out: Arc<Output>,
        received: Instant,
    ) -> io::Result<Speaker> {
        let control = Arc::new(Control::default());
        let thread = {
            let control = control.clone();
            std::thread::Builder::new()
                .name("sd_kazeia speaker".into())
                .spawn(move || {
                    let terminal = relay(stream, format, &control, &out, received);
                    // The stream (and with it the provider's work) is dropped before the terminal event.
                    if let Err(e) = out.event(&terminal) {
                        log::error(&format!("cannot report the end of a message: {e}"));
                    }
                })?
        };
        Ok(Speaker { control, thread })
    }

    pub fn control(&self) -> &Control {
        &self.control
    }

    /// Whether the terminal event has been written.
    pub fn finished(&self) -> bool {
        self.thread.is_finished()
    }

    /// Stops (unless already finished) and waits for the terminal event.
    pub fn stop_and_wait(self) {
        self.control.stop();
        let _ = self.thread.join();
    }
}

/// Relays the stream; returns the terminal event.
fn relay(
    stream: PipeReader,
    format: AudioFormat,
    control: &Control,
    out: &Output,
    received: Instant,
) -> Event {
    if out.event(&Event::Begin).is_err() {
        return Event::Stop;
    }
    let mut buffer = BlockBuffer::new(format.block_samples, format.gain);
    let mut first = true;
    let mut send = |samples: Vec<i16>| {
        out.audio(&samples, format.sample_rate)?;
        if std::mem::take(&mut first) {
            log::debug(&format!(
                "timing: first audio block ({} samples) sent {:.1} ms after the message",
                samples.len(),
                received.elapsed().as_secs_f64() * 1e3
            ));
        }
        Ok::<(), io::Error>(())
    };
    let result = (|| -> io::Result<Event> {
        let mut reader = SpielReader::new(Interruptible {
            pipe: stream,
            control,
        })?;
        let mut first_read = true;
        while let Some(chunk) = reader.next_chunk()? {
            match chunk {
                Chunk::Audio(pcm) => {
                    if first_read {
                        first_read = false;
                        log::debug(&format!(
                            "timing: first audio from the provider ({} bytes) {:.1} ms after the message",
                            pcm.len(),
                            received.elapsed().as_secs_f64() * 1e3
                        ));
                    }
                    buffer.push_s16le(&pcm);
                    // Audio that has arrived is sent now, the rest of a block included: waiting to fill it
                    // would hold the first sound back until the provider's next chunk (hundreds of ms when
                    // the prosody filter leaves the first chunk shorter than a block).
                    while let Some(block) = buffer.full_block().or_else(|| buffer.flush()) {
                        if control.stopped() {
                            return Ok(Event::Stop);
                        }
                        send(block)?;
                    }
                }
                Chunk::Event {
                    kind: EventKind::Mark,
                    name,
                    ..
                } => {
                    // A mark is reached once the audio before it has been delivered.
                    if let Some(block) = buffer.flush() {
                        send(block)?;
                    }
                    if control.stopped() {
                        return Ok(Event::Stop);
                    }
                    out.event(&Event::Mark(name.clone()))?;
                    if name.starts_with("__spd_") && control.pause.load(Ordering::SeqCst) {
                        return Ok(Event::Pause);
                    }
                }
                Chunk::Event { .. } => {}
            }
        }
        if let Some(block) = buffer.flush() {
            send(block)?;
        }
        Ok(Event::End)
    })();
    match result {
        Ok(event) => event,
        Err(e) if is_stop(&e) => Event::Stop,
        Err(e) => {
            // The provider failed mid-message (or the server went away): what was sent stands.
            log::error(&format!("speech stream from the provider failed: {e}"));
            if control.stopped() {
                Event::Stop
            } else {
                Event::End
            }
        }
    }
}

/// The error a read returns once a stop is requested (not `Interrupted`, which `read_exact` retries).
#[derive(Debug)]
struct StopRequested;

impl std::fmt::Display for StopRequested {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("stop requested")
    }
}

impl std::error::Error for StopRequested {}

fn is_stop(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|inner| inner.is::<StopRequested>())
}

/// The provider's pipe, read in waits of at most [`POLL_INTERVAL`] so a stop request interrupts a read.
struct Interruptible<'a> {
    pipe: PipeReader,
    control: &'a Control,
}

impl Read for Interruptible<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            if self.control.stopped() {
                return Err(io::Error::other(StopRequested));
            }
            let mut fd = libc::pollfd {
                fd: self.pipe.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd for the duration of the call.
            let n = unsafe { libc::poll(&mut fd, 1, POLL_INTERVAL.as_millis() as libc::c_int) };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if n > 0 {
                return self.pipe.read(buf);
            }
        }
    }
}
