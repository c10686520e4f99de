"""What the test modules share: tiny models, batches with known counts, report fixtures,
trainer builders and the gloo set-up (one definition each; test modules import from here and
never from one another, which ``tests/test_suite_layout.py`` checks).

- ``models``: the tiny Llama and the small hand-written models.
- ``batches``: padded batches, token-id rows, a dataset and a recording collator.
- ``text``: an in-memory word tokenizer and texts over its words.
- ``truth``: PyTorch's own FLOP counts of rows (``FlopCounterMode``), never flopmeter's.
- ``token_truth``: token statistics counted in plain Python, and hypothesis strategies.
- ``host_syncs``: a recorder of host reads and collectives.
- ``reports``: a hand-made valid report and the bad report files.
- ``planner``: the planner's config, words and saved tokenizer.
- ``trainers``: the Hugging Face ``Trainer`` and the Lightning fit of the tests.
- ``dist``: the two-process gloo group, and the torchrun scripts' write log.
- ``zero_code``: an unmodified script run under zero-code metering (environment or ``flopmeter run``).
"""
