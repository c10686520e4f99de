"""Framework adapters: thin translations of framework hooks into FlopMeter calls."""
