"""The meter's life: its hooks, parts and facts, the report of a snapshot, the run's file, resume, events and SIGTERM."""
