"""proflab run's bootstrap: ``proflab run`` puts this folder first on the profiled program's
PYTHONPATH. With PROFLAB_RUN_CONFIG set, it loads proflab's in-process runtime by file path
(standard library only, so any Python 3 interpreter can load it) and then runs the
sitecustomize this one hides, if there is one further along the path."""

import importlib.util
import os
import sys


def _start_runtime():
    if not os.environ.get("PROFLAB_RUN_CONFIG") or "_proflab_run" in sys.modules:
        return
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "_child.py")
    try:
        spec = importlib.util.spec_from_file_location("_proflab_run", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules["_proflab_run"] = module
        spec.loader.exec_module(module)
        module.start()
    except Exception as e:  # never stop the program from running
        sys.modules.pop("_proflab_run", None)
        sys.stderr.write(f"proflab: the in-process runtime did not start: {type(e).__name__}: {e}\n")


def _chain():
    """Import the next sitecustomize on sys.path, as if this one were not there."""
    here = os.path.dirname(os.path.abspath(__file__))
    saved = sys.path[:]
    this = sys.modules.pop("sitecustomize", None)
    try:
        sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
        import sitecustomize  # noqa: F401  (the other one, when there is one)
    except ImportError:
        pass
    except Exception as e:
        sys.stderr.write(f"proflab: the program's own sitecustomize failed: {type(e).__name__}: {e}\n")
    finally:
        sys.path[:] = saved
        if this is not None and "sitecustomize" not in sys.modules:
            sys.modules["sitecustomize"] = this


_start_runtime()
_chain()
