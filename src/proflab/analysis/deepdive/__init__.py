"""The kernel deep dive: Nsight Compute verdicts (``verdicts``), the roofline, the verdicts
joined to the timeline (``join``) and the FLOPs of matrix multiplies (``flops``). The report
that carries them is :func:`proflab.report.deepdive.deep_dive`'s."""
