"""The judges of a trace: what "valid" means, each schema's format rules, and the released check.

"Valid" is defined once, here, in the two readings the rewards need (docs/glossary.md's words):
  well formed              `check_well_formed`: the schema's tag rules hold on the reading, it has
                           no stray tag and is not truncated; sequential traces too. What the
                           layout can lay out: PAPO's drop keeps these (`RewardResult.layout_ok`).
  a valid parallel trace   `check_parallel`: well formed, and one valid block or more (two or more
                           branches: `Block.valid`). The parallel-strict, accuracy_times_parallel
                           and valid_parallel rewards, the parallel ratio and Parallel-R1's
                           cold-start filter ask this.
The rest derives from them: `check_structured` (NPR's format: the format rules on the text, well
formed, a block); a block's own share is what the reading records of it (`Block.well_formed`,
`Block.valid` in trace.py, which this file reads), and `TraceStats.valid_blocks` counts them.

The format rules (`check_format`, the `format` reward) judge a text. Parallel-R1's Algorithm 1
(scan the tags in order with a stack):
  1. a closing tag must match the tag on top of the stack;
  2. every <Parallel> block holds at least two <Path>s (directly inside it);
  3. <Summary> is the next tag after </Parallel>;
  4. the stack is empty at the end;
  5. the number of <Summary> equals the number of </Parallel>.
Text between tags is never inspected, and a trace without any tag passes (it is not parallel).

NPR's rules (our reading of its released prompt; `check_npr_tags` on the tags, three more on a text):
  1. a <guideline> holds one or more <plan>…</plan> and nothing else; nothing nests;
  2. the steps right after </guideline> are as many as its plans;
  3. step i opens with "i:" (it executes plan i)                                          [text]
  4. the steps are followed by <takeaway>…</takeaway> (it analyses them), then the main chain;
  5. no text between the tags of a round (whitespace aside)                                [text]
  6. the answer comes after the last </takeaway>: text follows it                       [text]
"Step i uses only plan i" and "the takeaway only analyses" are about meaning: not checked.
A trace without tags passes, and so does a round with one plan; neither is parallel.

Algorithm 1 accepts tags the lenient reading (`trace.py`: what the sampler and layout follow)
treats as stray text: a nested <Path>, a <Path>…</Path> after the summary. So the two readings of
"valid" ask the rules of the reading's tags and refuse a stray one. Parallel-R1's released code
implements Algorithm 1 more loosely in four places; the rewards that mirror that code (`parallel`,
`accuracy_parallel_bonus`) ask `check_released_format`, which says where.
Not here: the reading itself (trace.py), the rewards built on these judges (rewards.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from .tags import PARALLEL_R1, TagSchema, find_tags
from .trace import Trace, parse_trace, read_tag


@dataclass(frozen=True)
class FormatCheck:
    ok: bool  # True when every rule holds
    reason: str = ""  # why not, in a few words ("" when ok)

    def __bool__(self) -> bool:
        return self.ok


def check_well_formed(trace: Trace) -> FormatCheck:
    """Well formed: the schema's tag rules on the reading's tags, no stray tag, and not truncated
    (cut inside a block or a summary); it may be sequential (no tag, or NPR rounds of one plan).
    What the layout can lay out, and what PAPO's drop keeps. NPR's released code keeps a rollout
    when it can build its attention mask and positions (no nested or unmatched step tag, no round
    left open) and it is not longer than the budget; here the budget cuts a response, and one cut
    inside a block is truncated. Our tag rules are the stricter side (as many steps as plans, for one).

    On a reading with no stray tag that is not truncated, the tag rules hold exactly when every
    block is well formed (`Block.well_formed`); they are checked anyway, so the definition reads
    as the rule it is.

    >>> check_well_formed(parse_trace("Final Answer: 4")).ok, check_well_formed(parse_trace("<Parallel><Path>x")).reason
    (True, '<Path> is never closed')
    """
    rules = check_tag_sequence(trace.tags, trace.schema)
    if rules and trace.error:  # stray tags, or the input ends inside a block or a summary
        return FormatCheck(False, trace.error)
    return rules


def check_parallel(trace: Trace | str, schema: TagSchema = PARALLEL_R1) -> FormatCheck:
    """A valid parallel trace: well formed (`check_well_formed`) with one valid block or more
    (`Block.valid`: closed, its summary closed, two or more closed branches). A text is read
    first (with `schema`); a `Trace` is judged by the schema it was read with. Judged on the
    reading (for a rollout: its token ids, as sampled and as the layout trains on them). Under NPR
    this is its "parallel trigger" (a guideline of two or more plans) in a well-formed response.

    >>> check_parallel("a<Parallel><Path>x</Path><Path>y</Path></Parallel><Summary>s</Summary>b").ok
    True
    >>> check_parallel("<Parallel><Path>a</Path><Path>b</Path></Parallel><Summary>s</Summary><Path>z</Path>")
    FormatCheck(ok=False, reason='2 stray tag(s), first at offset 69')
    >>> check_parallel("Final Answer: 4").reason
    'no valid parallel block'
    """
    trace = parse_trace(trace, schema) if isinstance(trace, str) else trace
    well_formed = check_well_formed(trace)
    if not well_formed:
        return well_formed
    if not any(block.valid for block in trace.blocks):
        s = trace.schema
        return FormatCheck(False, f"no {s.block_open} of two or more {s.plan_open}" if s.planned else "no valid parallel block")
    return FormatCheck(True)


def check_structured(text: str, schema: TagSchema = PARALLEL_R1) -> FormatCheck:
    """A structured trace: the schema's format rules hold on the text (`check_format`), its
    reading is well formed (`check_well_formed`), and it holds at least one block. Under NPR a
    round of one plan counts: this is NPR's own format check, what its rejection sampling keeps
    (with a correct answer) and what `npr_format` pays for. A text without tags is not one.

    NPR's released check (`compute_format_score`, a score >= 0 passes) reads the same tag rules,
    with two differences from our rules 1-6: it does not look for the "i:" labels (our rule 3,
    from its prompt, which asks for them), and it also fails a plan under 3 characters, a step or
    takeaway under 6 (whitespace removed) and an empty \\boxed{}; we leave those out, because they
    are sized for its maths, not a task's (the toy's takeaway "no" is 2 characters).

    >>> from nanopar.tags import NPR
    >>> one = "<guideline><plan>1:add</plan></guideline><step>1:2+2=4</step><takeaway>4</takeaway>Final Answer: 4"
    >>> check_structured(one, NPR).ok, check_structured("Final Answer: 4", NPR).reason
    (True, 'no <guideline>')
    """
    rules = check_format(text, schema)
    if not rules:
        return rules
    trace = parse_trace(text, schema)
    well_formed = check_well_formed(trace)
    if not well_formed:
        return well_formed
    if not trace.blocks:
        return FormatCheck(False, f"no {schema.block_open}")
    return FormatCheck(True)


def check_format(text: str, schema: TagSchema = PARALLEL_R1) -> FormatCheck:
    """The schema's format rules on a text: Algorithm 1, or NPR's rules 1-6.

    >>> check_format("a <Parallel><Path>x</Path><Path>y</Path></Parallel><Summary>z</Summary> b").ok
    True
    >>> check_format("<Parallel><Path>x</Path></Parallel><Summary>z</Summary>").reason
    'a <Parallel> block holds 1 <Path>; at least 2 are needed'
    """
    tags = find_tags(text, schema)
    rules = check_tag_sequence([role for _, _, role in tags], schema)
    if not rules or not schema.planned:
        return rules
    return _check_npr_text(text, tags, schema)


def check_tag_sequence(names: list[str], schema: TagSchema = PARALLEL_R1) -> FormatCheck:
    """The schema's rules on the tags alone, given as roles ("block_open", "path_close", ...):
    Algorithm 1, or NPR's tag rules (`check_npr_tags`) for a schema with plans."""
    if schema.planned:
        return check_npr_tags(names, schema)
    stack: list[str] = []  # open kinds: "block", "path", "summary"
    paths_in_block: list[int] = []  # one counter per open <Parallel>
    summary_due = False  # the previous tag was </Parallel>
    summaries = parallel_closes = 0
    for name in names:
        kind, side = name.rsplit("_", 1)
        tag = getattr(schema, name)
        if summary_due and name != "summary_open":
            return FormatCheck(False, f"{tag} follows {schema.block_close}; expected {schema.summary_open}")
        summary_due = False
        if side == "open":
            if kind == "path" and stack and stack[-1] == "block":
                paths_in_block[-1] += 1
            elif kind == "block":
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
        if kind == "block":
            paths = paths_in_block.pop()
            if paths < 2:
                return FormatCheck(
                    False, f"a {schema.block_open} block holds {paths} {schema.path_open}; at least 2 are needed"
                )
            parallel_closes += 1
            summary_due = True
    if summary_due:
        return FormatCheck(False, f"{schema.block_close} is not followed by {schema.summary_open}")
    if stack:
        return FormatCheck(False, f"{getattr(schema, stack[-1] + '_open')} is never closed")
    if summaries != parallel_closes:
        return FormatCheck(
            False, f"{summaries} {schema.summary_open} for {parallel_closes} {schema.block_close}"
        )
    return FormatCheck(True)


def check_released_format(text: str) -> FormatCheck:
    """Parallel-R1's released format check (`check_parallel_thinking_format` in
    verl/verl/utils/reward_score/math_dapo_acc_parallel_interved.py, the check its alternating
    reward reads), on Parallel-R1's tags in the text. It departs from Algorithm 1 as
    `check_tag_sequence` reads it in four places, each passing what that one fails:
      - <Summary> is never pushed and </Summary> never checked: a summary left open, a stray </Summary>;
      - a path counts when it closes while a block is open, at any depth: a nested path counts;
      - after </Parallel> only a <Parallel> drops the expected <Summary>: a path between
        </Parallel> and <Summary> passes;
      - the summaries are counted against the </Parallel> in the text.
    The released function lists every error; this one reports the first.

    >>> check_released_format("<Parallel><Path>a</Path><Path>b</Path></Parallel><Summary>s").ok
    True
    >>> check_released_format("<Parallel><Path>a</Path></Parallel><Summary>s</Summary>").reason
    'a <Parallel> block holds 1 closed <Path>; at least 2 are needed'
    """
    s = PARALLEL_R1
    stack: list[str] = []  # open kinds: "block", "path"
    closed_paths: list[int] = []  # one counter per open <Parallel>
    summary_due, summaries, errors = False, 0, []
    for _, _, role in find_tags(text, s):
        if role == "block_open":
            stack.append("block")
            closed_paths.append(0)
            summary_due = False
        elif role == "path_open":
            stack.append("path")
        elif role in ("path_close", "block_close"):
            kind = role.removesuffix("_close")
            if stack[-1:] != [kind]:
                errors.append(f"{getattr(s, role)} does not close {getattr(s, kind + '_open')}")
                continue
            stack.pop()
            if kind == "path" and closed_paths:
                closed_paths[-1] += 1
            if kind == "block":
                paths = closed_paths.pop()
                if paths < 2:
                    errors.append(f"a {s.block_open} block holds {paths} closed {s.path_open}; at least 2 are needed")
                summary_due = True
        elif role == "summary_open":
            if not summary_due:
                errors.append(f"{s.summary_open} does not follow {s.block_close}")
            summary_due, summaries = False, summaries + 1
    if stack:
        errors.append(f"{getattr(s, stack[-1] + '_open')} is never closed")
    if summary_due:
        errors.append(f"the last {s.block_close} is not followed by {s.summary_open}")
    if summaries != text.count(s.block_close):
        errors.append(f"{summaries} {s.summary_open} for {text.count(s.block_close)} {s.block_close}")
    return FormatCheck(not errors, errors[0] if errors else "")


_INSIDE = {"plans": "block_open", "plan": "plan_open", "step": "path_open", "takeaway": "summary_open"}


def check_npr_tags(names: list[str], schema: TagSchema) -> FormatCheck:
    """NPR's rules 1, 2 and 4 on the tags alone (roles, as `check_tag_sequence` takes them).

    >>> from nanopar.tags import NPR
    >>> check_npr_tags(["block_open", "plan_open", "plan_close", "plans_close", "path_open", "path_close",
    ...                 "summary_open", "summary_close"], NPR).ok
    True
    >>> check_npr_tags(["block_open", "plans_close"], NPR).reason
    'a <guideline> holds no <plan>; one or more are needed'
    """
    s = schema
    state, plans, steps = "main", 0, 0  # state: main, plans, plan, steps, step, takeaway
    for role in names:
        tag = getattr(s, role)
        if state == "main" and role == "block_open":
            state, plans = "plans", 0
        elif state == "main":
            return FormatCheck(False, f"{tag} outside a round; a round opens with {s.block_open}")
        elif state == "plans" and role == "plan_open":
            state = "plan"
        elif state == "plans" and role == "plans_close":
            if plans == 0:
                return FormatCheck(False, f"a {s.block_open} holds no {s.plan_open}; one or more are needed")
            state, steps = "steps", 0
        elif state == "plans":
            return FormatCheck(False, f"{tag} inside a {s.block_open}, where only {s.plan_open}s belong")
        elif state in ("plan", "step", "takeaway"):
            closing = {"plan": "plan_close", "step": "path_close", "takeaway": "summary_close"}[state]
            if role != closing:
                return FormatCheck(False, f"{tag} inside a {getattr(s, _INSIDE[state])}")
            state, plans, steps = {"plan": ("plans", plans + 1, steps), "step": ("steps", plans, steps + 1),
                                   "takeaway": ("main", plans, steps)}[state]
        elif role == "path_open" and steps < plans:  # state "steps"
            state = "step"
        elif role == "summary_open" and steps == plans:
            state = "takeaway"
        elif role in ("path_open", "summary_open"):
            return FormatCheck(False, f"a guideline of {plans} {s.plan_open} is followed by "
                                      f"{steps + (role == 'path_open')} {s.path_open}; the counts must match")
        else:
            return FormatCheck(False, f"{tag} after the steps; expected {s.path_open} or {s.summary_open}")
    if state != "main":
        return FormatCheck(False, f"{getattr(s, _INSIDE.get(state, 'block_open'))} is never closed"
                           if state != "steps" else f"the steps are not followed by {s.summary_open}")
    return FormatCheck(True)


def _check_npr_text(text: str, tags: list[tuple[int, int, str]], schema: TagSchema) -> FormatCheck:
    """NPR's rules 3, 5 and 6 on a text whose tags already pass `check_npr_tags`."""
    state, step = "main", 0
    for (_, end, role), (start, _, following) in zip(tags, tags[1:]):
        state, _ = read_tag(state, role, schema)
        if role == "plans_close":
            step = 0
        if role == "path_open":
            step += 1
            label = schema.label(step - 1)
            if not text[end:].lstrip().startswith(label):
                return FormatCheck(False, f"step {step} does not open with {label!r}")
        if state in ("plans", "block") and text[end:start].strip():
            return FormatCheck(False, f"text between {getattr(schema, role)} and {getattr(schema, following)}")
    if tags and tags[-1][2] == "summary_close" and not text[tags[-1][1]:].strip():
        return FormatCheck(False, f"no answer after the last {schema.summary_close}")
    return FormatCheck(True)

