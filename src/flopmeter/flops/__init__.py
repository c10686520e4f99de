"""FLOP estimates: one pure function per method, gathered by :func:`compute_estimates`.

* ``seed`` and ``six_nd`` (:mod:`flopmeter.flops.formulas`): the simple formulas, for comparison;
* ``transformer`` (:mod:`flopmeter.flops.transformer`): the model's own layers and attention,
  from a :class:`~flopmeter.flops.model_profile.ModelProfile` taken at the first training micro-batch;
  the primary figure when the architecture is recognised;
* ``measured`` (:mod:`flopmeter.flops.scaling`): dispatch-level counts of sampled
  micro-batches, scaled to the run; the run's own consistency check.

During a run, a :class:`~flopmeter.flops.recorder.FlopModelRecorder` takes the profile and the
samples; its :class:`~flopmeter.flops.recorder.FlopObservations` go to :func:`compute_estimates`.
"""
