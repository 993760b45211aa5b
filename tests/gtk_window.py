#!/usr/bin/python3
"""A GTK 3 window with one button, for screen-reader tests (tests/desktop.rs): opens, takes the keyboard
focus itself (no window manager needed) and prints "focused" once GTK has it.

Usage: gtk_window.py TITLE BUTTON_LABEL
"""
import sys

import gi

gi.require_version("Gtk", "3.0")
from gi.repository import Gtk  # noqa: E402

title, label = sys.argv[1], sys.argv[2]
window = Gtk.Window(title=title)
window.add(Gtk.Button(label=label))
window.connect("destroy", Gtk.main_quit)
window.connect("focus-in-event", lambda *_: print("focused", flush=True))
window.show_all()
window.present()
Gtk.main()
