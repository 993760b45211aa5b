//! The PipeWire connection: one thread running a PipeWire main loop, owning the context, the core and
//! one playback stream (PipeWire objects are `!Send`). Other threads talk to it through a
//! `pipewire::channel` and share each utterance's queue ([`Shared`]).
//!
//! The stream is mono `f32` at the utterance's rate (PipeWire resamples), media.role Accessibility,
//! node.latency 10 ms. Its `process` callback runs on PipeWire's real-time data thread (`RT_PROCESS`), in
//! the graph cycle that plays what it hands over, so a busy machine does not make it miss cycles; it
//! touches only [`Feed`] and the utterance's queue, whose writers hold the lock just to append a chunk.
//! Between utterances the stream stays connected but inactive: no wake-ups, and the next utterance
//! starts without a negotiation. A paused utterance keeps the stream active and feeds it silence.
//!
//! Stream semantics relied on (pw_stream 0.3.65): after `flush(true)` the `drained` event fires (on this
//! thread) once the graph has played what was queued; the stream then stays "drained" until
//! `set_active(false)` resets it; `flush(false)` drops the queued buffers and flushes the node (the
//! resampler's history too). A stream left drained (its `drained` flag set again on every cycle) takes no
//! audio until flushed and deactivated: a playback whose audio waits untaken restarts it so.
//!
//! A stopped utterance plays out its fade (its queue holds only that) and drains like a finished one; an
//! utterance started meanwhile waits as `next` and takes the stream right after the fade, with no flush
//! between them. When the connection is lost, the utterances fed keep their audio and wait for the
//! playback to connect again (`Shared::server_lost`).

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::rc::{Rc, Weak};
use std::sync::mpsc::{sync_channel, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{anyhow, bail, Result};
use pipewire as pw;
use pw::context::ContextRc;
use pw::core::CoreRc;
use pw::main_loop::MainLoopRc;
use pw::properties::properties;
use pw::spa;
use pw::stream::{Stream, StreamFlags, StreamListener, StreamRc, StreamState};

use super::pipewire_sink::Shared;
use super::sample_queue::SampleQueue;

/// How long connecting may take before the caller gets an error instead of a hang.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

pub(super) enum Command {
    /// Play this utterance (ends the one playing, if any).
    Start(Arc<Shared>),
    Stop(Arc<Shared>),
    /// This utterance's audio waits and the stream takes none: flush and deactivate the stream as a stop does,
    /// then activate it again, which clears a drain it was left in (see `pipewire_sink::KICK_AFTER`).
    Restart(Arc<Shared>),
    Quit,
}

/// Why the connection ended, once it has.
#[derive(Default)]
struct Status {
    lost: Mutex<Option<String>>,
}

impl Status {
    fn lost(&self) -> Option<String> {
        self.lost.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn set_lost(&self, why: &str) {
        self.lost
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert_with(|| why.to_owned());
    }
}

/// What a playback keeps to reach the loop thread.
#[derive(Clone)]
pub(super) struct Handle {
    sender: pw::channel::Sender<Command>,
    status: Arc<Status>,
}

impl Handle {
    /// Why the connection ended, if it has.
    pub(super) fn lost(&self) -> Option<String> {
        self.status.lost()
    }

    pub(super) fn send(&self, command: Command) -> Result<()> {
        if let Some(why) = self.status.lost() {
            bail!("pipewire: {why}");
        }
        self.sender
            .send(command)
            .map_err(|_| anyhow!("pipewire: the connection thread is gone"))
    }
}

pub(super) struct Connection {
    handle: Handle,
    thread: Option<JoinHandle<()>>,
}

impl Connection {
    /// Starts the loop thread, connects and makes the stream (inactive, at `rate`). Returns once the
    /// server has answered, or an error (never later than [`CONNECT_TIMEOUT`]).
    pub(super) fn start(
        target: Option<String>,
        remote: Option<PathBuf>,
        rate: u32,
    ) -> Result<Connection> {
        let (sender, receiver) = pw::channel::channel();
        let status = Arc::new(Status::default());
        let (ready_tx, ready_rx) = sync_channel(1);
        let thread = {
            let status = status.clone();
            let remote = remote.clone();
            std::thread::Builder::new()
                .name("kazeia-pipewire".into())
                .spawn(move || run(target, remote, rate, receiver, status, ready_tx))?
        };
        let socket = socket_description(remote.as_deref());
        match ready_rx.recv_timeout(CONNECT_TIMEOUT) {
            Ok(Ok(())) => Ok(Connection {
                handle: Handle { sender, status },
                thread: Some(thread),
            }),
            Ok(Err(why)) => {
                let _ = thread.join();
                bail!("pipewire ({socket}): {why}")
            }
            Err(RecvTimeoutError::Timeout) => {
                // Left to end on its own if the server ever answers; nobody waits for it.
                status.set_lost("did not answer");
                let _ = sender.send(Command::Quit);
                bail!(
                    "pipewire ({socket}): the server did not answer within {} s",
                    CONNECT_TIMEOUT.as_secs()
                )
            }
            Err(RecvTimeoutError::Disconnected) => {
                let _ = thread.join();
                bail!("pipewire ({socket}): the connection thread failed")
            }
        }
    }

    /// Why the connection ended (the server went away, the stream failed), if it has.
    pub(super) fn lost(&self) -> Option<String> {
        self.handle.status.lost()
    }

    pub(super) fn handle(&self) -> Handle {
        self.handle.clone()
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        let _ = self.handle.sender.send(Command::Quit);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Where libpipewire will look for the server, for error messages (it reads the same variables).
fn socket_description(remote: Option<&Path>) -> String {
    if let Some(path) = remote {
        return path.display().to_string();
    }
    let name = std::env::var("PIPEWIRE_REMOTE")
        .ok()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "pipewire-0".into());
    let dir = std::env::var("PIPEWIRE_RUNTIME_DIR")
        .or_else(|_| std::env::var("XDG_RUNTIME_DIR"))
        .unwrap_or_else(|_| "/run/pipewire".into());
    if name.starts_with('/') {
        name
    } else {
        format!("{dir}/{name}")
    }
}

/// The loop thread's state. Borrows of its cells never span a PipeWire call, which may call back.
struct Ctx {
    mainloop: MainLoopRc,
    core: CoreRc,
    target: Option<String>,
    status: Arc<Status>,
    output: RefCell<Option<Output>>,
    feed: Arc<Feed>,
}

struct Output {
    // Declared first so that they are unregistered before the stream is destroyed.
    _feeder: StreamListener<Arc<Feed>>,
    _listener: StreamListener<Weak<Ctx>>,
    stream: StreamRc,
    rate: u32,
}

impl Drop for Output {
    fn drop(&mut self) {
        // Takes the node out of the graph (waiting for the data thread) before the listeners go: the
        // data thread must not be inside `process` when its closure is freed.
        let _ = self.stream.disconnect();
    }
}

/// What the real-time `process` callback shares with the loop thread. Its lock is never held across a
/// PipeWire call on the loop thread: some of those wait for the data thread.
#[derive(Default)]
struct Feed {
    state: Mutex<FeedState>,
}

#[derive(Default)]
struct FeedState {
    /// The utterance being played, if any.
    current: Option<Arc<Shared>>,
    /// Started while `current` plays out the fade of its stop: it takes the stream once the fade is out.
    next: Option<Arc<Shared>>,
    /// `flush(true)` was called for it and `drained` has not come yet.
    draining: bool,
    /// Silence played after its last sample.
    silence_after_end: u64,
    /// Silence fed since the last sample.
    silence_since_sound: u64,
}

impl Feed {
    fn lock(&self) -> MutexGuard<'_, FeedState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes `next` the utterance fed (none: feed nothing); returns the one it replaces.
    fn replace(&self, next: Option<Arc<Shared>>) -> Option<Arc<Shared>> {
        let mut feed = self.lock();
        feed.draining = false;
        feed.silence_after_end = 0;
        feed.silence_since_sound = 0;
        std::mem::replace(&mut feed.current, next)
    }

    fn is_current(&self, shared: &Arc<Shared>) -> bool {
        self.lock()
            .current
            .as_ref()
            .is_some_and(|c| Arc::ptr_eq(c, shared))
    }

    /// Takes `shared` out of `next` if it waits there; whether it did.
    fn take_next(&self, shared: &Arc<Shared>) -> bool {
        let mut feed = self.lock();
        let waiting = feed.next.as_ref().is_some_and(|n| Arc::ptr_eq(n, shared));
        if waiting {
            feed.next = None;
        }
        waiting
    }

    /// Makes `shared` wait for the fade of a stopped `current` (on a stream of its rate that is not
    /// draining), as `next`; whether it does.
    fn follow_fade(&self, shared: &Arc<Shared>, same_rate: bool) -> bool {
        let mut feed = self.lock();
        let fading = feed.current.as_ref().is_some_and(|c| {
            let state = c.lock();
            state.stopped && !state.done
        });
        if !same_rate || feed.draining || !fading {
            return false;
        }
        if let Some(superseded) = feed.next.replace(shared.clone()) {
            superseded.end();
        }
        true
    }

    /// Empties the feed: the current utterance and the next.
    fn take_all(&self) -> [Option<Arc<Shared>>; 2] {
        let mut feed = self.lock();
        feed.draining = false;
        [feed.current.take(), feed.next.take()]
    }

    /// One graph cycle wants audio (data thread): hand over up to one cycle of the current utterance.
    fn process(&self, stream: &Stream) {
        let time = stream.time().ok();
        let mut feed = self.lock();
        let Some(shared) = feed.current.clone() else {
            return;
        };
        let mut state = shared.lock();
        if state.done {
            return;
        }
        // A cycle for it: the server is here.
        state.away = None;
        if state.stopped && state.queue.is_empty() {
            if let Some(next) = feed.next.take() {
                // Its fade is out: the utterance that started meanwhile plays from this cycle on.
                state.done = true;
                drop(state);
                feed.current = Some(next);
                feed.draining = false;
                feed.silence_after_end = 0;
                feed.silence_since_sound = 0;
                drop(feed);
                shared.notify();
                return self.process(stream);
            }
        }
        // Everything handed over in earlier cycles has been played, but what waits in the resampler and
        // the device, unless silence fed since has pushed it out. (A stopped utterance's fade does not
        // count.)
        let in_flight = time.as_ref().map_or(0, |t| in_flight(t, shared.rate));
        let in_flight = in_flight.saturating_sub(feed.silence_since_sound);
        if !state.stopped {
            state.played = state.played.max(state.consumed.saturating_sub(in_flight));
        }
        // Every cycle gets a full buffer: the samples there are, then silence (paused, or synthesis
        // behind). The silence pushes the last samples out of the resampler, so what came before a pause
        // or a dry spell is heard whole at once (delivering nothing left its last 1.4 ms in the
        // resampler until more audio came) and `played()` can count it.
        let mut written = (0, 0);
        if let Some(mut buffer) = stream.dequeue_buffer() {
            let source = (!state.paused).then_some(&mut state.queue);
            written = fill(&mut buffer, source, shared.rate);
        } // the buffer is queued when dropped
        state.consumed += written.0;
        feed.silence_since_sound = match written {
            (0, zeros) => feed.silence_since_sound + zeros,
            (_, zeros) => zeros,
        };
        let mut drain = false;
        if state.finishing && state.queue.is_empty() && !state.paused {
            // Silence behind the last sample pushes it out of the resampler; left there, it would be lost
            // and would click at the start of the next utterance.
            feed.silence_after_end += written.1;
            let resampler = time.as_ref().map_or(0, |t| t.buffered());
            let enough = resampler + u64::from(shared.rate.div_ceil(1000));
            drain = feed.silence_after_end >= enough && !feed.draining;
        }
        feed.draining |= drain;
        drop(state);
        drop(feed);
        shared.notify();
        if drain {
            let _ = stream.flush(true);
        }
    }
}

fn run(
    target: Option<String>,
    remote: Option<PathBuf>,
    rate: u32,
    receiver: pw::channel::Receiver<Command>,
    status: Arc<Status>,
    ready: SyncSender<std::result::Result<(), String>>,
) {
    pw::init();
    let connected = (|| -> std::result::Result<_, String> {
        let mainloop =
            MainLoopRc::new(None).map_err(|e| format!("cannot make a main loop: {e}"))?;
        // client-rt.conf (as pw-play uses) loads module-rt: the data thread that feeds the stream gets
        // real-time priority (directly, or through RTKit or the portal), so synthesis threads busy on
        // every core do not starve it. Plain client.conf leaves it a normal thread.
        let context = ContextRc::new(
            &mainloop,
            Some(properties! {
                *pw::keys::APP_NAME => "Kazeia",
                *pw::keys::CONFIG_NAME => "client-rt.conf",
            }),
        )
        .map_err(|e| format!("cannot make a context: {e}"))?;
        let mut props = properties! { *pw::keys::APP_NAME => "Kazeia" };
        if let Some(path) = &remote {
            props.insert(*pw::keys::REMOTE_NAME, path.to_string_lossy().as_bytes());
        }
        let core = context
            .connect_rc(Some(props))
            .map_err(|e| format!("cannot connect ({e}): is PipeWire running for this user?"))?;
        Ok((mainloop, context, core))
    })();
    let (mainloop, context, core) = match connected {
        Ok(c) => c,
        Err(why) => {
            let _ = ready.send(Err(why));
            return;
        }
    };
    let ctx = Rc::new(Ctx {
        mainloop: mainloop.clone(),
        core: core.clone(),
        target,
        status: status.clone(),
        output: RefCell::new(None),
        feed: Arc::default(),
    });
    let ready = Rc::new(RefCell::new(Some(ready)));
    if let Err(why) = ctx.make_stream(rate, false) {
        if let Some(ready) = ready.borrow_mut().take() {
            let _ = ready.send(Err(why));
        }
        return;
    }
    // The server answering a sync proves the connection works before `start` returns.
    let pending = match core.sync(0) {
        Ok(seq) => seq.seq(),
        Err(e) => {
            if let Some(ready) = ready.borrow_mut().take() {
                let _ = ready.send(Err(format!("the server does not answer: {e}")));
            }
            return;
        }
    };
    let core_listener = core
        .add_listener_local()
        .done({
            let ready = ready.clone();
            move |id, seq| {
                if id == pw::core::PW_ID_CORE && seq.seq() == pending {
                    if let Some(ready) = ready.borrow_mut().take() {
                        let _ = ready.send(Ok(()));
                    }
                }
            }
        })
        .error({
            let ctx = Rc::downgrade(&ctx);
            move |id, _seq, res, message| {
                // Errors on the core itself are fatal: the server went away or refused us.
                if id == pw::core::PW_ID_CORE {
                    if let Some(ctx) = ctx.upgrade() {
                        let errno = std::io::Error::from_raw_os_error(-res);
                        ctx.lose(&format!("connection lost ({message}: {errno})"));
                    }
                }
            }
        })
        .register();
    let attached = receiver.attach(mainloop.loop_(), {
        let ctx = Rc::downgrade(&ctx);
        move |command| {
            if let Some(ctx) = ctx.upgrade() {
                ctx.handle(command);
            }
        }
    });

    mainloop.run();

    status.set_lost("the connection was closed");
    let why = status.lost().unwrap_or_default();
    if let Some(ready) = ready.borrow_mut().take() {
        let _ = ready.send(Err(why.clone()));
    }
    for shared in ctx.feed.take_all().into_iter().flatten() {
        shared.server_lost(&why);
    }
    drop(attached);
    drop(core_listener);
    drop(ctx.output.take());
    drop(ctx);
    drop(core);
    drop(context);
    drop(mainloop);
}

impl Ctx {
    /// Makes the playback stream for `rate` (replacing any other), active or not.
    fn make_stream(self: &Rc<Self>, rate: u32, active: bool) -> std::result::Result<(), String> {
        drop(self.output.take());
        let mut props = properties! {
            *pw::keys::MEDIA_TYPE => "Audio",
            *pw::keys::MEDIA_CATEGORY => "Playback",
            *pw::keys::MEDIA_ROLE => "Accessibility",
            *pw::keys::MEDIA_NAME => "Speech",
            *pw::keys::APP_NAME => "Kazeia",
            *pw::keys::NODE_NAME => "kazeia",
            // 10 ms cycles: first audio waits for one at most, and a stop cuts within one.
            *pw::keys::NODE_LATENCY => format!("{}/{rate}", rate.div_ceil(100)),
        };
        if let Some(target) = &self.target {
            props.insert(*pw::keys::TARGET_OBJECT, target.as_bytes());
        }
        let stream = StreamRc::new(self.core.clone(), "kazeia-speech", props)
            .map_err(|e| format!("cannot make a stream: {e}"))?;
        // Registered first: with RT_PROCESS, only the first listener's `process` is called, on the data
        // thread, so its user data is the thread-safe `Feed` alone.
        let feeder = stream
            .add_local_listener_with_user_data(self.feed.clone())
            .process(|stream, feed| feed.process(stream))
            .register()
            .map_err(|e| format!("cannot listen to the stream: {e}"))?;
        let listener = stream
            .add_local_listener_with_user_data(Rc::downgrade(self))
            .state_changed(|_, ctx, _, new| {
                if let (StreamState::Error(why), Some(ctx)) = (new, ctx.upgrade()) {
                    ctx.lose(&format!("stream error: {why}"));
                }
            })
            .drained(|stream, ctx| {
                if let Some(ctx) = ctx.upgrade() {
                    ctx.drained(stream);
                }
            })
            .register()
            .map_err(|e| format!("cannot listen to the stream: {e}"))?;
        let format = format_pod(rate)?;
        let mut params = [spa::pod::Pod::from_bytes(&format).ok_or("bad format pod")?];
        let mut flags =
            StreamFlags::AUTOCONNECT | StreamFlags::MAP_BUFFERS | StreamFlags::RT_PROCESS;
        if !active {
            flags |= StreamFlags::INACTIVE;
        }
        stream
            .connect(spa::utils::Direction::Output, None, flags, &mut params)
            .map_err(|e| format!("cannot connect the stream: {e}"))?;
        *self.output.borrow_mut() = Some(Output {
            _feeder: feeder,
            _listener: listener,
            stream,
            rate,
        });
        Ok(())
    }

    fn stream(&self) -> Option<StreamRc> {
        self.output.borrow().as_ref().map(|o| o.stream.clone())
    }

    fn handle(self: &Rc<Self>, command: Command) {
        match command {
            Command::Start(shared) => self.start(shared),
            Command::Stop(shared) => {
                if self.feed.is_current(&shared) {
                    self.feed.replace(None);
                    self.silence();
                } else {
                    self.feed.take_next(&shared);
                }
            }
            Command::Restart(shared) => {
                if self.feed.is_current(&shared) {
                    self.silence();
                    self.set_active(true);
                } else if self.feed.take_next(&shared) {
                    // The fade it waits for is not being played: it takes the stream now.
                    self.start_now(shared);
                }
            }
            Command::Quit => self.mainloop.quit(),
        }
    }

    fn start(self: &Rc<Self>, shared: Arc<Shared>) {
        let same_rate = self
            .output
            .borrow()
            .as_ref()
            .is_some_and(|o| o.rate == shared.rate);
        if !self.feed.follow_fade(&shared, same_rate) {
            self.start_now(shared);
        }
    }

    /// Makes `shared` the utterance played, ending any other at once.
    fn start_now(self: &Rc<Self>, shared: Arc<Shared>) {
        let rate = shared.rate;
        let [previous, next] = self.feed.take_all();
        if let Some(next) = next {
            next.end();
        }
        if let Some(previous) = previous {
            // Still playing: its audio goes, as on a stop. Deactivating also clears a drain it may have
            // begun, which would otherwise keep the stream from asking for more.
            previous.end();
            if std::env::var_os("KAZEIA_TEST_PIPEWIRE_KEEP_DRAIN").is_none() {
                self.silence();
            }
            // (Fault injection for the tests: with that variable set the drain stays, as a stop racing
            // PipeWire's data thread can leave it, and the playback's restart must recover.)
        }
        let same_rate = self
            .output
            .borrow()
            .as_ref()
            .is_some_and(|o| o.rate == rate);
        self.feed.replace(Some(shared));
        if same_rate {
            self.set_active(true);
        } else if let Err(why) = self.make_stream(rate, true) {
            self.lose(&why);
        }
    }

    /// Drops what PipeWire holds of the audio and leaves the stream inactive.
    fn silence(&self) {
        if let Some(stream) = self.stream() {
            let _ = stream.flush(false);
        }
        self.set_active(false);
    }

    fn set_active(&self, active: bool) {
        if let Some(stream) = self.stream() {
            let _ = stream.set_active(active);
        }
    }

    fn drained(&self, stream: &Stream) {
        let done = {
            let mut feed = self.feed.lock();
            if !feed.draining {
                return; // a drain that a stop or another utterance overtook
            }
            feed.draining = false;
            feed.silence_after_end = 0;
            feed.current.take()
        };
        if let Some(shared) = done {
            shared.drained();
        }
        let _ = stream.set_active(false);
    }

    /// The server or the stream failed: the utterances fed wait for a new connection (their playback
    /// makes it), and the thread ends.
    fn lose(&self, why: &str) {
        self.status.set_lost(why);
        for shared in self.feed.take_all().into_iter().flatten() {
            shared.server_lost(why);
        }
        self.mainloop.quit();
    }
}

/// Fills `buffer` with one cycle: samples from `queue` while there are any, then silence; returns how many
/// samples and how many zeros.
fn fill(buffer: &mut pw::buffer::Buffer, queue: Option<&mut SampleQueue>, rate: u32) -> (u64, u64) {
    // The resampler says how much it needs for this cycle; without it, 10 ms.
    let requested = buffer.requested() as usize;
    let wanted = if requested > 0 {
        requested
    } else {
        rate.div_ceil(100) as usize
    };
    let Some(data) = buffer.datas_mut().first_mut() else {
        return (0, 0);
    };
    let (real, room) = match data.data() {
        Some(bytes) => {
            let room = wanted.min(bytes.len() / 4);
            let real = queue.map_or(0, |q| q.take_into(&mut bytes[..room * 4]));
            bytes[real * 4..room * 4].fill(0); // 0.0f32 is all zero bytes
            (real, room)
        }
        None => (0, 0),
    };
    let chunk = data.chunk_mut();
    *chunk.offset_mut() = 0;
    *chunk.stride_mut() = 4;
    *chunk.size_mut() = (room * 4) as u32;
    (real as u64, (room - real) as u64)
}

/// Samples (at `rate`) between the stream and the listener: the resampler's and the device's delay.
fn in_flight(time: &pw::stream::Time, rate: u32) -> u64 {
    let graph = time.rate();
    let delay = time.delay().max(0) as u64;
    let device = if graph.denom == 0 {
        0
    } else {
        delay * graph.num as u64 * rate as u64 / graph.denom as u64
    };
    device + time.buffered()
}

/// The stream's only format: mono `f32` at `rate`.
fn format_pod(rate: u32) -> std::result::Result<Vec<u8>, String> {
    let mut info = spa::param::audio::AudioInfoRaw::new();
    info.set_format(spa::param::audio::AudioFormat::F32LE);
    info.set_rate(rate);
    info.set_channels(1);
    let mut position = [0; spa::param::audio::MAX_CHANNELS];
    position[0] = spa::sys::SPA_AUDIO_CHANNEL_MONO;
    info.set_position(position);
    let object = spa::pod::Value::Object(spa::pod::Object {
        type_: spa::sys::SPA_TYPE_OBJECT_Format,
        id: spa::sys::SPA_PARAM_EnumFormat,
        properties: info.into(),
    });
    spa::pod::serialize::PodSerializer::serialize(std::io::Cursor::new(Vec::new()), &object)
        .map(|(cursor, _)| cursor.into_inner())
        .map_err(|e| format!("cannot describe the audio format: {e:?}"))
}
