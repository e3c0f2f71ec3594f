"""What a fix saves: the step replayed with the fix made, its critical path before and after.

``graph`` builds the step graph from a trace (the host calls that drive the device, the GPU
work they launch, the waits between them), ``replay`` walks it with a plan's durations,
``fixes`` turns each fix into a change of that plan, and ``model.WhatIf`` takes the
profiler's own cost out and predicts the bare step time each set of fixes saves.
"""

from proflab.analysis.whatif.fixes import Fix
from proflab.analysis.whatif.model import Prediction, WhatIf

__all__ = ["Fix", "Prediction", "WhatIf"]
