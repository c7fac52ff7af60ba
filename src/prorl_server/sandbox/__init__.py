"""Rootless sandboxes: one Runtime interface, apptainer / bubblewrap / local runtimes, reaper, loopback IPs."""
