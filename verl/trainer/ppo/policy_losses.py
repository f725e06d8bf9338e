"""The old path of :mod:`verl.algorithms.policy_losses`, kept so that code written for verl imports unchanged.

The algorithm modules moved below the workers (the actor, the critic and the config use them, and a module they all
import lives below all of them). This name is the moved module itself, not a copy: attributes set through either
name (a registry swapped in by a test, say) are seen through both.
"""

import sys

from verl.algorithms import policy_losses as _moved

sys.modules[__name__] = _moved
