"""SciPy's `milp` (HiGHS) as the solvers call it: quiet.

HiGHS prints to the process's stdout although asked for no output (a
`transformNewIntegerFeasibleSolution` line, seen on the Equinox model), and remat-opt writes
its module to stdout: `milp` runs with descriptor 1 on the null device. HiGHS options SciPy
does not name (`mip_abs_gap`) it hands to HiGHS as they are, with a warning that is not for
users: that goes too. Where `solvers.solve_all` runs solves in threads, it quiets HiGHS once
around them all (`side_by_side`): descriptor 1 and the warning filters are the process's,
not a thread's.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import sys
import warnings

side_by_side = False     # solvers.solve_all's threads are running, inside one `quiet()`


def milp(*args, **kwargs):
    """`scipy.optimize.milp(*args, **kwargs)`, quiet."""
    from scipy.optimize import milp as scipy_milp
    if side_by_side:
        return scipy_milp(*args, **kwargs)
    with quiet():
        return scipy_milp(*args, **kwargs)


@contextlib.contextmanager
def quiet():
    """HiGHS's stray output and SciPy's warning about the options it passes on, gone."""
    with _c_stdout_discarded(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Unrecognized options detected",
                                category=RuntimeWarning)
        yield


@contextlib.contextmanager
def _c_stdout_discarded():
    """File descriptor 1 points to the null device inside; C's buffers are flushed before
    it points back, so nothing written inside comes out after."""
    try:
        sys.stdout.flush()
        saved = os.dup(1)
    except (OSError, ValueError, AttributeError):   # no descriptor 1: nothing to protect
        yield
        return
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 1)
        yield
    finally:
        _flush_c_streams()
        os.dup2(saved, 1)
        os.close(saved)
        os.close(null)


def _flush_c_streams() -> None:
    try:
        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError):     # no C library to ask (not on POSIX)
        pass
