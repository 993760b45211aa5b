//! Kazeia Hexagon backend plugin: not yet implemented (see README.md).
