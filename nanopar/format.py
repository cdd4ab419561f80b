"""Algorithm 1 of Parallel-R1: the strict format check of a parallel-thinking trace.

The rules, exactly as released (scan the tags in order with a stack):
  1. a closing tag must match the tag on top of the stack;
  2. every <Parallel> block holds at least two <Path>s (directly inside it);
  3. <Summary> is the next tag after </Parallel>;
  4. the stack is empty at the end;
  5. the number of <Summary> equals the number of </Parallel>.
Text between tags is never inspected, and a trace without any tag is valid (and not parallel).
This check is a judge (rewards, data filters). It does not decide how a malformed trace is
attended to or sampled; the lenient reading in `trace.py` does that.
"""

from __future__ import annotations

from dataclasses import dataclass

from .tags import PARALLEL_R1, TagSchema, find_tags


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
