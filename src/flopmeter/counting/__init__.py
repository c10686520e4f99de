"""Counting a run: the parameter census, reading a forward call, the call plan, the counters and their saved state."""
