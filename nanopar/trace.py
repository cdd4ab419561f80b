"""Read a parallel-thinking trace into its structure, and the statistics the papers report.

The reading is *lenient*: it never raises, and it is the rule the sampler and the layout follow,
so a trace is attended to in training exactly as it was decoded. A small state machine:

    main     --<Parallel>-->  block       (the block's preamble is shared text)
    block    --<Path>------>  path        (a path runs to the next <Path> or </Parallel>,
    path     --</Path>----->  block        so text between paths belongs to the path before)
    block    --</Parallel>->  after       (text may sit between </Parallel> and <Summary>)
    after    --<Summary>--->  summary     (any other tag: the block had no summary; read in main)
    summary  --</Summary>-->  main

Any other tag in a state is *stray*: read as plain text and recorded (e.g. `</Path>` in the main
chain, `<Parallel>` inside a path, which means blocks never nest). Input that ends inside a block
or a summary is *truncated*, and its open path simply ends there.

Positions are offsets in the input's units: characters for `parse_trace(text)`, tokens for
`parse_ids(ids)`. Not here: the judges (`format.check_format`, Parallel-R1's Algorithm 1, and
`format.check_parallel`, what "a valid parallel trace" means everywhere).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .tags import PARALLEL_R1, TagIds, TagSchema, find_tags


@dataclass
class Span:
    start: int  # first unit (inclusive)
    end: int  # one past the last unit

    def __len__(self) -> int:
        return self.end - self.start


@dataclass
class Block:
    open: int  # offset of <Parallel>
    paths: list[Span] = field(default_factory=list)  # from its <Path> to the next <Path>/</Parallel>
    closed_paths: int = 0  # paths that ended with </Path>
    close: int | None = None  # offset of </Parallel> (None: truncated inside the block)
    end: int | None = None  # one past </Parallel>
    summary: Span | None = None  # <Summary> … </Summary> inclusive (end = input end if unclosed)
    summary_closed: bool = False  # the summary ended with </Summary>

    @property
    def valid(self) -> bool:
        """Closed, at least two closed paths, and a closed summary: a usable parallel block."""
        return self.close is not None and self.closed_paths >= 2 and self.summary_closed


@dataclass
class Trace:
    length: int  # units in the input
    blocks: list[Block] = field(default_factory=list)
    main: list[Span] = field(default_factory=list)  # main-chain text, outside blocks and summaries
    stray: list[int] = field(default_factory=list)  # offsets of tags read as plain text
    truncated: bool = False  # the input ends inside a block or a summary
    tags: list[str] = field(default_factory=list)  # every tag read, in order ("path_open", ...), stray or not

    @property
    def error(self) -> str | None:
        """The first structural problem in words, or None for a clean reading."""
        if self.stray:
            return f"{len(self.stray)} stray tag(s), first at offset {self.stray[0]}"
        if self.truncated:
            return "ends inside a parallel block or summary"
        return None


@dataclass
class TraceStats:
    length: int  # units in the response (tokens for ids)
    blocks: int  # parallel blocks read, valid or not
    valid_blocks: int  # blocks with >= 2 closed paths, </Parallel> and a closed summary
    paths_per_block: list[int]  # paths in each block
    relative_positions: list[float]  # offset of each <Parallel> / length (Parallel-R1: ~0.4 -> ~0.8)
    critical_path: int  # units on the longest route: siblings of the longest path run in parallel

    @property
    def has_parallel(self) -> bool:
        """At least one valid parallel block (what Parallel-R1's stage-1 reward asks for)."""
        return self.valid_blocks > 0

    @property
    def acceleration(self) -> float:
        """Total units / critical-path units: the ideal speedup of decoding paths side by side."""
        return self.length / self.critical_path if self.critical_path else 1.0


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
        relative_positions=[b.open / trace.length for b in trace.blocks],
        critical_path=trace.length - saved,
    )


def parse_trace(text: str, schema: TagSchema = PARALLEL_R1) -> Trace:
    """Read a text; offsets are character offsets.

    >>> t = parse_trace("a<Parallel><Path>x</Path><Path>yy</Path></Parallel><Summary>s</Summary>b")
    >>> [len(p) for p in t.blocks[0].paths], t.blocks[0].valid, t.error
    ([14, 15], True, None)
    """
    return _read(find_tags(text, schema), len(text))


def parse_ids(ids, tag_ids: TagIds) -> Trace:
    """Read a sequence of token ids (a list or 1-D tensor); offsets are token indices."""
    ids = ids.tolist() if hasattr(ids, "tolist") else list(ids)
    names = tag_ids.names()
    return _read([(i, i + 1, names[t]) for i, t in enumerate(ids) if t in names], len(ids))


# The state machine: (state, tag) -> next state. A tag not listed for a state is stray.
TRANSITIONS = {
    ("main", "parallel_open"): "block",
    ("block", "path_open"): "path",
    ("path", "path_close"): "block",
    ("block", "parallel_close"): "after",
    ("after", "summary_open"): "summary",
    ("summary", "summary_close"): "main",
}


def read_tag(state: str, name: str) -> tuple[str, bool]:
    """One step of the reading: (next state, whether the tag is structural rather than stray)."""
    if state == "after" and name != "summary_open":
        state = "main"  # the block had no summary; the tag is read in the main chain
    following = TRANSITIONS.get((state, name))
    return (following, True) if following else (state, False)


def _read(tags: list[tuple[int, int, str]], length: int) -> Trace:
    """Follow `read_tag` over (start, end, tag name) events and record the spans."""
    trace = Trace(length)
    state, main_from, block = "main", 0, None

    def end_path(at: int) -> None:  # the open path of `block` (if any) ends before `at`
        if block.paths and block.paths[-1].end < 0:
            block.paths[-1].end = at

    for start, end, name in tags:
        trace.tags.append(name)
        if state == "after" and name != "summary_open":
            main_from = block.end
        state, structural = read_tag(state, name)
        if not structural:
            trace.stray.append(start)
        elif name == "parallel_open":
            _add_main(trace, main_from, start)
            block = Block(open=start)
            trace.blocks.append(block)
        elif name == "path_open":
            end_path(start)
            block.paths.append(Span(start, -1))
        elif name == "path_close":
            block.closed_paths += 1
        elif name == "parallel_close":
            end_path(start)
            block.close, block.end = start, end
        elif name == "summary_open":
            _add_main(trace, block.end, start)  # text between </Parallel> and <Summary>
            block.summary = Span(start, -1)
        else:  # summary_close
            block.summary.end, block.summary_closed = end, True
            main_from = end
    if state in ("block", "path"):
        end_path(length)
        trace.truncated = True
    elif state == "summary":
        block.summary.end = length
        trace.truncated = True
    else:
        _add_main(trace, block.end if state == "after" else main_from, length)
    return trace


def _add_main(trace: Trace, start: int, end: int) -> None:
    if end > start:
        trace.main.append(Span(start, end))
