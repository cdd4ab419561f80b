r"""The committed teacher: a chain that commits to an approach and varies it locally, beside blocks
whose paths each start from a different first move: the papers' account of what a block buys.

teacher.py's chain tries random routes, so its attempts are as varied as a block's paths and a
block can buy time, not accuracy (docs/toy.md). Here an *approach* is a first move ("7*3"), and
every attempt at an approach begins with its *best* route: of the routes that open with that move,
the one whose value is closest to the target (a route that reaches it, when one does; that part
is one step of arithmetic the model can learn). The two teachers differ only in what follows a
miss:

sequential (`committed_sequential_trace`): the chain stays with the approach and varies it, one or
two more of its routes (`LOCAL_TRIES`: misses all, since its best one missed), before it gives it
up for another; 0..N wrong approaches (`WRONG_APPROACHES`), then the right one, whose best route
reaches the target ("numbers 3 7 12 target 33"):

    12+7=19,19+3=22vs33no
    12+7=19,19*3=57vs33no
    7*3=21,21+12=33vs33yes so (7*3)+12
    Final Answer: (7*3)+12

parallel (`committed_parallel_trace`): an exploring block's K paths are K different approaches,
each its best route; blocks until they hold as many attempts as the chain makes with the same
draws (so a block never tries fewer routes), the right approach at a random place of the last;
a verifying trace (easy only, VERIFICATION_SHARE) is the chain's attempts, then a block of checks,
as teacher.py's:

    <Parallel><Path>12+7=19,19+3=22vs33no</Path><Path>7*3=21,21+12=33vs33yes so (7*3)+12</Path><Path>12-7=5,5*3=15vs33no</Path></Parallel><Summary>(7*3)+12</Summary>
    Final Answer: (7*3)+12

Both write the same attempts in the same words and spend them from the same response budget; no
reward or check knows which teacher wrote a trace. What differs is how many approaches a number
of attempts covers: a chain of a attempts tries a third to a half as many as a block does, as a
chain of thought that commits to one idea and keeps fixing it. Whether a model trained on each
keeps that difference after RL is what a run measures (docs/toy.md, "The committed teacher").

Not here: NPR's rounds (Parallel-R1's tags only; NPR's teacher: teacher.npr_trace), correction
traces, the random teacher (teacher.py), the trace mixes (source.py: "toy:committed",
"toy:parallel-committed").
"""

from __future__ import annotations

import math
import random

from ..data import Problem
from ..tags import PARALLEL_R1, TagSchema
from .task import FINAL, Route, routes
from .teacher import (PARALLEL_PATHS, VERIFICATION_SHARE, attempt_text, block_text, check_block, first_move,
                      pick_checks, right_route)

WRONG_APPROACHES = {"easy": 2, "hard": 1}  # a chain gives up 0..N approaches before the right one (uniform)
LOCAL_TRIES = (1, 2)  # after an approach's best route misses, the chain tries this many more of its routes (drawn)


def approaches(problem: Problem) -> dict[str, list[Route]]:
    """Every first move of the problem and its legal routes, closest to the target first (the
    problem's own route first among those that reach it): {"7*3": [route, ...], ...}."""
    target, own = problem.extra["target"], tuple(problem.extra["steps"])
    by_move: dict[str, list[Route]] = {}
    for route in routes(problem.extra["numbers"]):
        by_move.setdefault(first_move(route), []).append(route)
    # sorted() is stable, so routes equally close keep routes()'s order
    return {move: sorted(rs, key=lambda r: (abs(r.value - target), r.steps != own)) for move, rs in by_move.items()}


def _right_and_wrong(problem: Problem, by_move: dict[str, list[Route]]) -> tuple[Route, list[str]]:
    """The right approach's best route (the problem's own) and the approaches whose best route
    misses (no route of theirs reaches the target), in routes()'s order; `by_move`: `approaches`."""
    right = by_move[first_move(right_route(problem))][0]
    return right, [move for move, rs in by_move.items() if rs[0].value != problem.extra["target"]]


def committed_chain(problem: Problem, rng: random.Random, by_move: dict[str, list[Route]] | None = None) -> list[Route]:
    """The committed chain's attempts: 0..WRONG_APPROACHES wrong approaches (fewer if the problem
    has fewer), each its best route and LOCAL_TRIES more of its routes, then the right one's best;
    `by_move`: the problem's `approaches`, where the caller has them already."""
    by_move = by_move or approaches(problem)
    right, wrong = _right_and_wrong(problem, by_move)
    given_up = rng.sample(wrong, min(rng.randint(0, WRONG_APPROACHES[problem.extra["level"]]), len(wrong)))
    chain = []
    for move in given_up:
        best, *rest = by_move[move]
        chain += [best] + rng.sample(rest, min(rng.choice(LOCAL_TRIES), len(rest)))
    return chain + [right]


def committed_sequential_trace(problem: Problem, rng: random.Random) -> str:
    """The committed chain's attempts one per line, then the answer."""
    return _chain_text(committed_chain(problem, rng), problem.extra["target"])


def _chain_text(chain: list[Route], target: int, block: str | None = None) -> str:
    """The chain's attempts one per line, a block of checks after them if given, then the answer."""
    lines = [attempt_text(r, target) for r in chain] + ([block] if block else [])
    return "\n".join(lines) + f"\n{FINAL} {chain[-1].expression}"


def committed_parallel_trace(problem: Problem, rng: random.Random, paths: int = PARALLEL_PATHS,
                             schema: TagSchema = PARALLEL_R1, kind: str | None = None) -> str:
    """An exploring or verifying trace in `schema`'s tags (Parallel-R1's shape; `kind` None: drawn,
    verification with probability VERIFICATION_SHARE, easy problems only):

    exploration  blocks of `paths` different approaches, each its best route, until they hold the
                 committed chain's attempts (drawn first, from the same generator); a block with no
                 route that checks out summed up "no", the last by the right route's expression.
                 Where the problem has too few wrong approaches, fewer blocks (never fewer than 2
                 paths); an easy problem with none verifies instead
    verification the committed chain's attempts, then a block of `paths` CHECKS of the answer
    """
    if schema.planned:
        raise ValueError(f"the committed teacher writes Parallel-R1's blocks, not {schema.name!r}'s rounds")
    if paths < 2:
        raise ValueError(f"a block of the committed teacher has at least 2 paths, not {paths}")
    if kind not in (None, "exploration", "verification"):
        raise ValueError(f"unknown committed trace kind {kind!r}: use exploration or verification")
    easy = problem.extra["level"] == "easy"
    if kind == "verification" and not easy:
        raise ValueError("the teacher verifies easy problems only: a hard route need not be a chain")
    if kind is None:
        kind = "verification" if easy and rng.random() < VERIFICATION_SHARE else "exploration"
    target, by_move = problem.extra["target"], approaches(problem)
    chain = committed_chain(problem, rng, by_move)
    right, wrong = _right_and_wrong(problem, by_move)
    if not wrong:  # every approach reaches the target ("numbers 1 1 1 target 2"): nothing to explore
        if not easy:  # a few hard ones ("1 1 2 1 target 3"): the chain, its one right attempt
            return _chain_text(chain, target)
        kind = "verification"
    if kind == "verification":
        return _chain_text(chain, target, check_block(schema, pick_checks(rng, paths), right, problem, right.expression))
    blocks = max(1, min(math.ceil(len(chain) / paths), (len(wrong) + 1) // paths))
    tried = [by_move[move][0] for move in rng.sample(wrong, min(blocks * paths - 1, len(wrong)))]
    tried.insert(len(tried) - rng.randrange(min(paths, len(tried) + 1)), right)  # a random place of the last block
    text = [block_text(schema, None, [attempt_text(r, target) for r in tried[i:i + paths]],
                       right.expression if right in tried[i:i + paths] else "no")
            for i in range(0, len(tried), paths)]
    return "\n".join(text) + f"\n{FINAL} {right.expression}"
