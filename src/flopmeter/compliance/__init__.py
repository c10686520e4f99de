"""Thresholds and verdicts of the EU AI Act downstream-modification rule.

``thresholds``: the rules; ``catalog``: the bundled pretraining-compute catalogue;
``original``: where the original compute comes from; ``verdict``: the verdict with the 30%
margin; ``lineage``: which runs a total counts, the total and its verdict (``parents`` wraps it
for a report's parent entries); ``obligations``: what follows on exceeds.
Pure functions and data: nothing here imports torch.
"""
