"""Checkpoint lifecycle of a platform home: registry pins, tiering and GC of every store it uses."""
