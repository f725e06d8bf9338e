"""``python -m verl.trainer.main_ppo`` with one worker killed mid-call: the entry point of the worker-death tests.

``python -m tests.special_e2e.main_ppo_killing_a_worker <group>:<rank>:<method>:<call> [main_ppo arguments ...]``
arms every worker group the trainer builds with that kill (``tests/single_controller/fault_injection.py``), then
runs :func:`verl.trainer.main_ppo.cli` with the remaining arguments, exit code included. The trainer itself knows
nothing of it.
"""

import sys

from tests.single_controller.fault_injection import KillPlan, kill_in_every_group
from verl.trainer.main_ppo import cli


def main(argv: list[str]) -> None:
    if not argv:
        sys.exit("usage: python -m tests.special_e2e.main_ppo_killing_a_worker <group>:<rank>:<method>:<call> ...")
    kill_in_every_group(KillPlan.parse(argv[0]))
    cli(argv[1:])


if __name__ == "__main__":
    main(sys.argv[1:])
