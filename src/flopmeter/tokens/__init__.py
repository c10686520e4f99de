"""The token statistics of a micro-batch: the dispatch, the batch, the CPU, torch and Triton implementations, staging."""
