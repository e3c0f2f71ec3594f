"""Collection: what runs a program under a profiler and leaves files for the readers."""
