#!/usr/bin/env python3
"""Speaks a text through Kazeia's D-Bus API and waits until it has been said: an example client.

    kazeia_say.py [--priority P] [--voice V] [--rate R] TEXT

It calls org.kazeia.Speech1.Speak on the session bus (D-Bus activation starts kazeiad if needed), waits for
the Finished signal of the id it got, and prints its reason (done, stopped, cancelled, shutdown or
"error: ..."). Exit status: 0 when the utterance ended, 1 on an error reply (its D-Bus error name and message
are printed, e.g. org.kazeia.Speech1.Error.InvalidArgs), 2 when the daemon reported an error while speaking.
Ctrl-C stops the utterance. Needs PyGObject (Debian: python3-gi). See docs/dbus-api.md.
"""

import argparse
import signal
import sys

import gi

gi.require_version("Gio", "2.0")
from gi.repository import Gio, GLib  # noqa: E402

BUS_NAME = "org.kazeia.Speech"
PATH = "/org/kazeia/Speech"
INTERFACE = "org.kazeia.Speech1"
PRIORITIES = ["important", "message", "text", "notification", "progress"]


def main():
    parser = argparse.ArgumentParser(description="Speak a text through kazeiad and wait for its end.")
    parser.add_argument("text")
    parser.add_argument("--priority", choices=PRIORITIES, default="text")
    parser.add_argument("--voice", help="a voice id from ListVoices (default: the configured voice)")
    parser.add_argument("--rate", type=float, help="speaking rate, 1 = normal")
    args = parser.parse_args()

    bus = Gio.bus_get_sync(Gio.BusType.SESSION, None)
    loop = GLib.MainLoop()
    finished = {}  # id -> reason, for every Finished seen (signals are broadcast to every client)
    wanted = []  # the id Speak returned, once it has

    def on_finished(_conn, _sender, _path, _iface, _member, params):
        utterance, reason = params.unpack()
        finished[utterance] = reason
        if wanted and wanted[0] == utterance:
            loop.quit()

    # Subscribe before speaking: a short utterance may end before Speak's reply is read.
    bus.signal_subscribe(
        None, INTERFACE, "Finished", PATH, None, Gio.DBusSignalFlags.NONE, on_finished
    )

    options = {"priority": GLib.Variant("s", args.priority)}
    if args.voice:
        options["voice"] = GLib.Variant("s", args.voice)
    if args.rate is not None:
        options["rate"] = GLib.Variant("d", args.rate)
    try:
        reply = bus.call_sync(
            BUS_NAME, PATH, INTERFACE, "Speak",
            GLib.Variant("(sa{sv})", (args.text, options)),
            GLib.VariantType("(t)"), Gio.DBusCallFlags.NONE,
            60_000,  # the first call may start the daemon and wait for its model
            None,
        )
    except GLib.Error as e:
        name = Gio.DBusError.get_remote_error(e) or "error"
        message = e.message.removeprefix(f"GDBus.Error:{name}: ")
        print(f"kazeia_say: {name}: {message}", file=sys.stderr)
        return 1
    (utterance,) = reply.unpack()
    wanted.append(utterance)

    def stop():
        bus.call_sync(BUS_NAME, PATH, INTERFACE, "Stop", GLib.Variant("(t)", (utterance,)),
                      None, Gio.DBusCallFlags.NONE, -1, None)
        return GLib.SOURCE_CONTINUE  # the Finished(stopped) that follows ends the loop

    GLib.unix_signal_add(GLib.PRIORITY_DEFAULT, signal.SIGINT, stop)
    if utterance not in finished:
        loop.run()
    reason = finished[utterance]
    print(reason)
    return 2 if reason.startswith("error") else 0


if __name__ == "__main__":
    sys.exit(main())
