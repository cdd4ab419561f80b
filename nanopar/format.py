"""The judges of a trace: Parallel-R1's Algorithm 1, and what "a valid parallel trace" means.

The rules, exactly as released (scan the tags in order with a stack):
  1. a closing tag must match the tag on top of the stack;
  2. every <Parallel> block holds at least two <Path>s (directly inside it);
  3. <Summary> is the next tag after </Parallel>;
  4. the stack is empty at the end;
  5. the number of <Summary> equals the number of </Parallel>.
Text between tags is never inspected, and a trace without any tag is valid (and not parallel).
Algorithm 1 accepts tags the lenient reading (`trace.py`: what the sampler and layout follow)
treats as stray text: a nested <Path>, a <Path>…</Path> after the summary. So every reward,
filter and metric that means "a valid parallel trace" asks `check_parallel` instead: Algorithm 1
on the tags as read AND no stray tag AND not truncated AND at least one valid block.
"""

from __future__ import annotations

from dataclasses import dataclass

from .tags import PARALLEL_R1, TagSchema, find_tags
from .trace import Trace, parse_trace


@dataclass(frozen=True)
class FormatCheck:
    ok: bool  # True when every rule holds
    reason: str = ""  # why not, in a few words ("" when ok)

    def __bool__(self) -> bool:
        return self.ok


def check_format(text: str, schema: TagSchema = PARALLEL_R1) -> FormatCheck:
    """Algorithm 1 on a text.

    >>> check_format("a <Parallel><Path>x</Path><Path>y</Path></Parallel><Summary>z</Summary> b").ok
    True
    >>> check_format("<Parallel><Path>x</Path></Parallel><Summary>z</Summary>").reason
    'a <Parallel> block holds 1 <Path>; at least 2 are needed'
    """
    return check_tag_sequence([name for _, _, name in find_tags(text, schema)], schema)


def check_parallel(trace: Trace | str, schema: TagSchema = PARALLEL_R1) -> FormatCheck:
    """A valid parallel trace, the one definition: the `parallel` rewards, `npr_format`, PAPO's drop,
    the distill filters and the parallel-ratio metric all ask this. A text is read first.

    Judged on the reading (for a rollout: its token ids, as sampled and as the layout trains on
    them). On a reading with no stray tag that is not truncated, Algorithm 1 holds exactly when
    every block is valid; it is checked anyway, so the definition reads as the rule it is.

    >>> check_parallel("a<Parallel><Path>x</Path><Path>y</Path></Parallel><Summary>s</Summary>b").ok
    True
    >>> check_parallel("<Parallel><Path>a</Path><Path>b</Path></Parallel><Summary>s</Summary><Path>z</Path>")
    FormatCheck(ok=False, reason='2 stray tag(s), first at offset 69')
    >>> check_parallel("Final Answer: 4").reason
    'no valid parallel block'
    """
    trace = parse_trace(trace, schema) if isinstance(trace, str) else trace
    algorithm_1 = check_tag_sequence(trace.tags, schema)
    if not algorithm_1:
        return algorithm_1
    if trace.error:  # stray tags, or the input ends inside a block or a summary
        return FormatCheck(False, trace.error)
    if not any(block.valid for block in trace.blocks):
        return FormatCheck(False, "no valid parallel block")
    return FormatCheck(True)


def check_tag_sequence(names: list[str], schema: TagSchema = PARALLEL_R1) -> FormatCheck:
    """Algorithm 1 on the tags alone, given as field names ("parallel_open", "path_close", ...)."""
    stack: list[str] = []  # open kinds: "parallel", "path", "summary"
    paths_in_block: list[int] = []  # one counter per open <Parallel>
    summary_due = False  # the previous tag was </Parallel>
    summaries = parallel_closes = 0
    for name in names:
        kind, side = name.rsplit("_", 1)
        tag = getattr(schema, name)
        if summary_due and name != "summary_open":
            return FormatCheck(False, f"{tag} follows {schema.parallel_close}; expected {schema.summary_open}")
        summary_due = False
        if side == "open":
            if kind == "path" and stack and stack[-1] == "parallel":
                paths_in_block[-1] += 1
            elif kind == "parallel":
                paths_in_block.append(0)
            elif kind == "summary":
                summaries += 1
            stack.append(kind)
            continue
        if not stack:
            return FormatCheck(False, f"{tag} closes nothing")
        if stack[-1] != kind:
            return FormatCheck(False, f"{tag} closes {getattr(schema, stack[-1] + '_open')}")
        stack.pop()
        if kind == "parallel":
            paths = paths_in_block.pop()
            if paths < 2:
                return FormatCheck(
                    False, f"a {schema.parallel_open} block holds {paths} {schema.path_open}; at least 2 are needed"
                )
            parallel_closes += 1
            summary_due = True
    if summary_due:
        return FormatCheck(False, f"{schema.parallel_close} is not followed by {schema.summary_open}")
    if stack:
        return FormatCheck(False, f"{getattr(schema, stack[-1] + '_open')} is never closed")
    if summaries != parallel_closes:
        return FormatCheck(
            False, f"{summaries} {schema.summary_open} for {parallel_closes} {schema.parallel_close}"
        )
    return FormatCheck(True)
