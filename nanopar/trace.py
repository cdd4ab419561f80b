"""Read a parallel-thinking trace into its structure, and the statistics the papers report.

The reading is *lenient*: it never raises, and it is the rule the sampler and the layout follow,
so a trace is attended to in training exactly as it was decoded. A small state machine, the
schema's (`TagSchema.transitions`); Parallel-R1's, then what NPR's has instead:

    main     --<Parallel>-->  block       (the block's preamble is shared text)
    block    --<Path>------>  path        (a path runs to the next <Path> or </Parallel>,
    path     --</Path>----->  block        so text between paths belongs to the path before)
    block    --</Parallel>->  after       (text may sit between </Parallel> and <Summary>)
    after    --<Summary>--->  summary     (any other tag: the block had no summary; read in main)
    summary  --</Summary>-->  main

    main --<guideline>--> plans --<plan>--> plan --</plan>--> plans --</guideline>--> block
    (its plans are shared text);  block --<step>/</step>--> as paths;  block --<takeaway>--> summary

Any other tag in a state is *stray*: read as plain text and recorded (e.g. `</Path>` in the main
chain, `<Parallel>` inside a path, which means blocks never nest). Input that ends inside a block
or a summary is *truncated*, and its open path simply ends there.

Positions are offsets in the input's units: characters for `parse_trace(text)`, tokens for
`parse_ids(ids)`. Not here: the judges (format.py: what "well formed" and "a valid parallel
trace" mean, built on the block facts recorded here, and each schema's format rules).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import NanoparError
from .tags import PARALLEL_R1, TagIds, TagSchema, find_tags


@dataclass
class Span:
    start: int  # first unit (inclusive)
    end: int  # one past the last unit

    def __len__(self) -> int:
        return self.end - self.start


@dataclass
class Block:
    open: int  # offset of <Parallel> (NPR: <guideline>)
    paths: list[Span] = field(default_factory=list)  # from its <Path> to the next <Path>/</Parallel>
    closed_paths: int = 0  # paths that ended with </Path>
    close: int | None = None  # offset of the tag that ends the paths: </Parallel> (NPR: <takeaway>)
    end: int | None = None  # one past </Parallel> (NPR: = close, the summary starts there)
    summary: Span | None = None  # <Summary> … </Summary> inclusive (end = input end if unclosed)
    summary_closed: bool = False  # the summary ended with </Summary>
    plans: list[Span] | None = None  # NPR: each <plan> … </plan> inclusive; None: a schema without plans

    @property
    def well_formed(self) -> bool:
        """Closed, a closed summary, and the branches its schema asks for: Parallel-R1 two or more
        closed paths; NPR one or more plans and exactly as many closed steps. A block's share of
        a well-formed trace (`format.check_well_formed`)."""
        if self.close is None or not self.summary_closed:
            return False
        if self.plans is None:
            return self.closed_paths >= 2
        return 1 <= len(self.plans) == self.closed_paths == len(self.paths)

    @property
    def valid(self) -> bool:
        """Well formed with two or more branches: a *parallel* block (an NPR guideline of one plan
        is well formed, but a step of the main chain). A valid parallel trace holds one or more
        (`format.check_parallel`)."""
        return self.well_formed and self.closed_paths >= 2


@dataclass
class Trace:
    length: int  # units in the input
    blocks: list[Block] = field(default_factory=list)
    main: list[Span] = field(default_factory=list)  # main-chain text, outside blocks and summaries
    stray: list[int] = field(default_factory=list)  # offsets of tags read as plain text
    truncated: bool = False  # the input ends inside a block or a summary
    tags: list[str] = field(default_factory=list)  # every tag read, in order, by role ("path_open", ...), stray or not
    schema: TagSchema = PARALLEL_R1  # the schema it was read with (the judges ask it)

    @property
    def error(self) -> str | None:
        """The first structural problem in words, or None for a clean reading."""
        if self.stray:
            return f"{len(self.stray)} stray tag(s), first at offset {self.stray[0]}"
        if self.truncated:
            return "ends inside a block or a summary"
        return None


@dataclass
class TraceStats:
    length: int  # units in the response (tokens for ids)
    blocks: int  # blocks read, valid or not (NPR: guidelines, of one plan too)
    valid_blocks: int  # valid blocks: well formed with >= 2 branches (Block.valid)
    paths_per_block: list[int]  # paths read in each block (NPR: steps)
    branches_per_block: list[int]  # the branch count each block chose: its paths; NPR: its plans (the model's choice)
    relative_positions: list[float]  # offset of each <Parallel> / length (Parallel-R1: ~0.4 -> ~0.8)
    critical_path: int  # units on the longest route: siblings of the longest path run in parallel

    @property
    def acceleration(self) -> float:
        return acceleration(self.length, self.critical_path)


def acceleration(units: int, critical_path: int) -> float:
    """Total units / critical-path units: the ideal speedup of decoding paths side by side, of one
    response or summed over many (1.0 for nothing decoded: the critical path is 0 only then).

    >>> acceleration(30, 15), acceleration(0, 0)
    (2.0, 1.0)
    """
    return units / critical_path if critical_path else 1.0


def trace_stats(trace: Trace) -> TraceStats:
    """Statistics of a read trace.

    >>> s = trace_stats(parse_trace("ab<Parallel><Path>x</Path><Path>y</Path></Parallel><Summary>s</Summary>"))
    >>> s.blocks, s.paths_per_block, round(s.relative_positions[0], 3), s.length - s.critical_path
    (1, [2], 0.028, 14)
    """
    saved = sum(sum(map(len, b.paths)) - max(map(len, b.paths), default=0) for b in trace.blocks)
    return TraceStats(
        length=trace.length,
        blocks=len(trace.blocks),
        valid_blocks=sum(b.valid for b in trace.blocks),
        paths_per_block=[len(b.paths) for b in trace.blocks],
        branches_per_block=[len(b.paths) if b.plans is None else len(b.plans) for b in trace.blocks],
        relative_positions=[b.open / trace.length for b in trace.blocks],
        critical_path=trace.length - saved,
    )


def parse_trace(text: str, schema: TagSchema = PARALLEL_R1) -> Trace:
    """Read a text; offsets are character offsets.

    >>> t = parse_trace("a<Parallel><Path>x</Path><Path>yy</Path></Parallel><Summary>s</Summary>b")
    >>> [len(p) for p in t.blocks[0].paths], t.blocks[0].valid, t.error
    ([14, 15], True, None)
    """
    return _read(find_tags(text, schema), len(text), schema)


def parse_ids(ids, tag_ids: TagIds | None) -> Trace:
    """Read a sequence of token ids (a list or 1-D tensor); offsets are token indices.
    `tag_ids` None: no id is a tag (plain decoding)."""
    if tag_ids is None:
        return _read([], len(ids), PARALLEL_R1)
    return parse_tagged_ids(ids, tag_ids.roles(), tag_ids.schema)


def parse_tagged_ids(ids, roles: dict[str, int], schema: TagSchema = PARALLEL_R1) -> Trace:
    """`parse_ids` given the tags' ids by role ({"block_open": 151665, ...}), as a saved record
    keeps them: the sampler's own reading again, without its tokenizer.

    >>> parse_tagged_ids([7, 0, 2, 9, 3, 2, 9, 3, 1, 4, 9, 5], dict(zip(PARALLEL_R1.roles(), range(6)))).blocks[0].valid
    True
    """
    if set(roles) != set(schema.roles()):
        raise NanoparError(f"tag ids by role {sorted(roles)}: schema {schema.name!r} has the roles "
                           f"{sorted(schema.roles())}")
    ids = ids.tolist() if hasattr(ids, "tolist") else list(ids)
    names = {i: role for role, i in roles.items()}
    return _read([(i, i + 1, names[t]) for i, t in enumerate(ids) if t in names], len(ids), schema)


def read_tag(state: str, role: str, schema: TagSchema = PARALLEL_R1) -> tuple[str, bool]:
    """One step of the reading: (next state, whether the tag is structural rather than stray)."""
    if state == "after" and role != "summary_open":
        state = "main"  # the block had no summary; the tag is read in the main chain
    following = schema.transitions.get((state, role))
    return (following, True) if following else (state, False)


def _read(tags: list[tuple[int, int, str]], length: int, schema: TagSchema) -> Trace:
    """Follow `read_tag` over (start, end, role) events and record the spans."""
    trace = Trace(length, schema=schema)
    state, main_from, block = "main", 0, None

    def end_path(at: int) -> None:  # the open path of `block` (if any) ends before `at`
        if block.paths and block.paths[-1].end < 0:
            block.paths[-1].end = at

    for start, end, role in tags:
        trace.tags.append(role)
        if state == "after" and role != "summary_open":
            main_from = block.end
        before = state
        state, structural = read_tag(state, role, schema)
        if not structural:
            trace.stray.append(start)
        elif role == "block_open":
            _add_main(trace, main_from, start)
            block = Block(open=start, plans=[] if schema.planned else None)
            trace.blocks.append(block)
        elif role == "plan_open":
            block.plans.append(Span(start, length))
        elif role == "plan_close":
            block.plans[-1].end = end
        elif role == "path_open":
            end_path(start)
            block.paths.append(Span(start, -1))
        elif role == "path_close":
            block.closed_paths += 1
        elif role == "block_close" or (role == "summary_open" and before == "block"):  # the paths end here
            end_path(start)
            block.close, block.end = start, end if role == "block_close" else start
        if structural and role == "summary_open":
            _add_main(trace, block.end, start)  # text between </Parallel> and <Summary>
            block.summary = Span(start, -1)
        elif structural and role == "summary_close":
            block.summary.end, block.summary_closed = end, True
            main_from = end
    if state in ("block", "path"):
        end_path(length)
        trace.truncated = True
    elif state == "summary":
        block.summary.end = length
        trace.truncated = True
    elif state in ("plans", "plan"):
        trace.truncated = True
    else:
        _add_main(trace, block.end if state == "after" else main_from, length)
    return trace


def _add_main(trace: Trace, start: int, end: int) -> None:
    if end > start:
        trace.main.append(Span(start, end))
