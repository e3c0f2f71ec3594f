"""The timeline of one trace: intervals and steps, where GPU time goes (``breakdown``), idle
gaps and their causes, launches, copies, user ranges, source lines, hot kernels and the
profiler's own cost (``observer``). :class:`proflab.analysis.Context` computes each once."""
