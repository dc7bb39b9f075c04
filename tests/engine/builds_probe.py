"""Run in a child process by test_builds_agree.py: random automata (over Stock)
and random streams from one seed, under every engine switch combination, in
whichever engine build this process runs; prints the build and the witnesses
of each case as JSON.

    python -m tests.engine.builds_probe SEED CASES
"""

from __future__ import annotations

import json
import random
import sys

from air.engine import BUILD
from tests.engine.test_indexes_support import CONFIGS, random_automaton, run_config, stream


def cases(seed: int, n: int):
    rng = random.Random(seed)
    for _ in range(n):
        specs = [tuple(rng.randrange(7) for _ in range(10)) for _ in range(rng.randint(1, 6))]
        values = [(rng.randrange(3), rng.randint(1, 5), rng.randint(1, 3), rng.choice((0, 0, 1, 2)),
                   rng.choice((0, 0, 0, 1, 3))) for _ in range(rng.randint(1, 40))]
        yield specs, values


def main(seed: int, n: int) -> None:
    out = []
    for specs, values in cases(seed, n):
        loads = [(f"o{i}", random_automaton(s)) for i, s in enumerate(specs)]
        events = stream(values)
        per_config = {}
        for name, opts in CONFIGS.items():
            _eng, ems = run_config(opts, loads, events)
            # the order of witnesses is part of what must agree, not only the multiset
            per_config[name] = [[em.owner, em.stream, em.kind, list(em.event.values), em.event.t0, em.event.t1]
                                for em in ems]
        out.append(per_config)
    json.dump({"build": BUILD, "cases": out}, sys.stdout)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
