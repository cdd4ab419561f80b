"""The tag schemas of parallel thinking, kept in one place: tags by role, and the rules they imply.

    Parallel-R1   <Parallel> <Path>…</Path> <Path>…</Path> </Parallel> <Summary>…</Summary>
    NPR           <guideline> <plan>1: …</plan> <plan>2: …</plan> </guideline>
                  <step>1: …</step> <step>2: …</step> <takeaway>…</takeaway>

Both are one shape: a block opens in the main chain, its branches ("paths", NPR's "steps") are
written side by side, a summary merges them. What differs is data on `TagSchema`: where the
engine forks (`fork_role`), how many branches (Parallel-R1: K per call; NPR: one per plan the
model wrote, `planned`), what a branch opens with (`label`), what the merge inserts
(`merge_roles`), and the reading itself (`transitions`). The reader, layout, sampler, judges,
stats and trees ask a schema; none of them names one. `TagIds` is the vocabulary as token ids;
`add_tag_tokens` makes the tags single tokens of a tokenizer (and rows of a model's embedding).
Importing this file does not import torch.
Not here: reading a trace (trace.py), judging one (format.py).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from . import NanoparError


MAX_PATHS = 8  # the most branches a block may have (each one is a lane of the sampler's batch)

# The roles a tag can play. Every schema has the first five; a schema has either `block_close`
# (Parallel-R1's shape: the paths end at </Parallel>, then the summary) or the three plan roles
# (NPR's shape: the block opens with plans, one branch per plan, the summary tag ends the paths).
ROLES = ("block_open", "block_close", "path_open", "path_close", "summary_open", "summary_close",
         "plan_open", "plan_close", "plans_close")


@dataclass(frozen=True)
class TagSchema:
    """A tag schema: the tag of each role, and from them every rule the reader, the engine and the
    judge follow (`transitions`, `fork_role`, `merge_roles`, `planned`)."""

    name: str = "parallel-r1"  # what --schema calls it
    block_open: str = "<Parallel>"  # opens a block in the main chain (NPR: <guideline>)
    block_close: str | None = "</Parallel>"  # ends the paths, the summary follows (NPR: none, <takeaway> ends them)
    path_open: str = "<Path>"  # opens one branch (NPR: <step>)
    path_close: str = "</Path>"  # closes it (NPR: </step>)
    summary_open: str = "<Summary>"  # opens the merge of the branches (NPR: <takeaway>)
    summary_close: str = "</Summary>"  # closes it; the main chain continues (NPR: </takeaway>)
    plan_open: str | None = None  # NPR: <plan>, one per branch the engine will fork
    plan_close: str | None = None  # NPR: </plan>
    plans_close: str | None = None  # NPR: </guideline>, ends the plans: the fork happens here
    numbered: bool = False  # each branch opens with its number ("1:"), forced by the engine (NPR)

    def __post_init__(self):
        plans = (self.plan_open, self.plan_close, self.plans_close)
        if (self.block_close is None) != all(plans) or (any(plans) and not all(plans)):
            raise NanoparError(f"tag schema {self.name!r}: give either block_close or all three plan tags")

    @property
    def planned(self) -> bool:
        """NPR's shape: the model writes one plan per branch, and so chooses how many branches."""
        return self.plans_close is not None

    def roles(self) -> dict[str, str]:
        """Role -> tag, for the roles this schema has, in `ROLES` order."""
        return {role: getattr(self, role) for role in ROLES if getattr(self, role) is not None}

    def all(self) -> tuple[str, ...]:
        """Every tag of the schema, in `ROLES` order."""
        return tuple(self.roles().values())

    @functools.cached_property
    def transitions(self) -> dict[tuple[str, str], str]:
        """The reading as a state machine: (state, role) -> next state; see trace.py."""
        table = {("block", "path_open"): "path", ("path", "path_close"): "block", ("summary", "summary_close"): "main"}
        if self.planned:
            table |= {("main", "block_open"): "plans", ("plans", "plan_open"): "plan", ("plan", "plan_close"): "plans",
                      ("plans", "plans_close"): "block", ("block", "summary_open"): "summary"}
        else:
            table |= {("main", "block_open"): "block", ("block", "block_close"): "after",
                      ("after", "summary_open"): "summary"}
        return table

    def as_sampled(self, text: str) -> str:
        r"""`text` with the whitespace taken out from between the tags the structured sampler writes
        back to back: the fork tag and a branch's opening, a branch's close and the next opening or
        the merge, the merge tags themselves (<Parallel><Path>, </Path><Path>, </Path></Parallel>,
        </Parallel><Summary>; NPR's </guideline><step>, </step><step>, </step><takeaway>, and a
        step's tag and its label, <step>1:). A trace
        laid out with newlines there (Parallel-GSM8K's) then trains the model on what it will be
        fed; a path's own text, its first and last newline included, is left alone.

        >>> PARALLEL_R1.as_sampled("a <Parallel>\n<Path>\nx\n</Path>\n<Path>y</Path>\n</Parallel>\n<Summary>s</Summary>")
        'a <Parallel><Path>\nx\n</Path><Path>y</Path></Parallel><Summary>s</Summary>'
        """
        merge = [getattr(self, role) for role in self.merge_roles]
        pairs = [(getattr(self, self.fork_role), self.path_open), (self.path_close, self.path_open),
                 (self.path_close, merge[0]), *zip(merge, merge[1:])]
        for before, after in pairs:
            text = re.sub(rf"(?<={re.escape(before)})\s+(?={re.escape(after)})", "", text)
        if self.numbered:  # the engine writes a step's label right after its tag: "<step>1:", never "<step>\n1:";
            # one rule for every numbered label, "1.2:" too (NPR's engine reads both kinds from the plans)
            text = re.sub(rf"(?<={re.escape(self.path_open)})\s+(?=\d+(?:\.\d+)*:)", "", text)
        return text

    @property
    def fork_role(self) -> str:
        """The tag after which the engine forks (structured mode): <Parallel>, or NPR's </guideline>."""
        return "plans_close" if self.planned else "block_open"

    @property
    def merge_roles(self) -> tuple[str, ...]:
        """What the engine inserts when the branches merge: </Parallel><Summary>, or NPR's <takeaway>."""
        return ("summary_open",) if self.planned else ("block_close", "summary_open")

    def label(self, k: int) -> str:
        """The text branch k (0-based) opens with after its tag: "1:" for NPR's first step, else ""."""
        return f"{k + 1}:" if self.numbered else ""


PARALLEL_R1 = TagSchema()
NPR = TagSchema(name="npr", block_open="<guideline>", block_close=None, path_open="<step>", path_close="</step>",
                summary_open="<takeaway>", summary_close="</takeaway>", plan_open="<plan>", plan_close="</plan>",
                plans_close="</guideline>", numbered=True)
SCHEMAS = {schema.name: schema for schema in (PARALLEL_R1, NPR)}


def schema_named(name: str) -> TagSchema:
    """The schema a flag names ("parallel-r1", "npr")."""
    if name not in SCHEMAS:
        raise NanoparError(f"unknown tag schema {name!r}: use one of {', '.join(SCHEMAS)}")
    return SCHEMAS[name]


@dataclass(frozen=True)
class TagIds:
    """A schema's tags as token ids (each tag must be a single token); None for a role it lacks.

    The first six are positional in Parallel-R1's order, so `TagIds(*range(6))` is its six tags.
    """

    block_open: int
    block_close: int | None
    path_open: int
    path_close: int
    summary_open: int
    summary_close: int
    plan_open: int | None = None
    plan_close: int | None = None
    plans_close: int | None = None
    labels: tuple[tuple[int, ...], ...] = ()  # numbered schemas: the ids of branch k's label ("1:"), k < MAX_PATHS
    schema: TagSchema = PARALLEL_R1

    def __post_init__(self):
        missing = [role for role in self.schema.roles() if getattr(self, role) is None]
        if missing or (self.schema.numbered and len(self.labels) < MAX_PATHS):
            raise NanoparError(f"tag ids for schema {self.schema.name!r}: give an id for every role "
                               f"(missing: {', '.join(missing) or 'none'}) and, numbered, {MAX_PATHS} labels")

    def roles(self) -> dict[str, int]:
        """Role -> id, for the roles the schema has."""
        return {role: getattr(self, role) for role in ROLES if getattr(self, role) is not None}

    def all(self) -> tuple[int, ...]:
        return tuple(self.roles().values())

    def names(self) -> dict[int, str]:
        """Token id -> role ("block_open", ...): how the parser reads an id sequence."""
        return {i: role for role, i in self.roles().items()}

    @classmethod
    def from_tokenizer(cls, tokenizer, schema: TagSchema = PARALLEL_R1) -> "TagIds":
        """Look the tags up in a tokenizer; raise if one of them is not a single token."""
        ids = {}
        for role, tag in schema.roles().items():
            encoded = tokenizer.encode(tag, add_special_tokens=False)
            if len(encoded) != 1:
                raise NanoparError(
                    f"tag {tag} is {len(encoded)} tokens in this tokenizer, not one; "
                    "add the tags with nanopar.tags.add_tag_tokens first"
                )
            ids[role] = encoded[0]
        labels = tuple(tuple(tokenizer.encode(schema.label(k), add_special_tokens=False)) for k in range(MAX_PATHS))
        return cls(**({"block_close": None} | ids), labels=labels if schema.numbered else (), schema=schema)


def find_tags(text: str, schema: TagSchema = PARALLEL_R1) -> list[tuple[int, int, str]]:
    """Every tag in `text`, in order, as (start, end, role).

    >>> find_tags("a<Path>b</Path>")
    [(1, 7, 'path_open'), (8, 15, 'path_close')]
    """
    pattern, by_text = _tag_pattern(schema)
    return [(m.start(), m.end(), by_text[m.group()]) for m in pattern.finditer(text)]


@functools.cache
def _tag_pattern(schema: TagSchema) -> tuple[re.Pattern, dict[str, str]]:
    by_text = {tag: role for role, tag in schema.roles().items()}
    longest_first = sorted(by_text, key=len, reverse=True)  # so no tag matches inside a longer one
    return re.compile("|".join(map(re.escape, longest_first))), by_text


def add_tag_tokens(tokenizer, model=None, schema: TagSchema = PARALLEL_R1) -> TagIds:
    """Add the schema's tags to `tokenizer` as single tokens (and rows of `model`); return their ids.

    Only tags the tokenizer lacks are added (`special_tokens=True`: never split, never
    normalised; note `decode(..., skip_special_tokens=True)` drops them). When the model's
    embedding has fewer rows than the tokenizer, it grows to a multiple of 64; the grown rows
    start at the mean of the old rows. Each just-added tag's row (input embedding, and output
    embedding when untied) starts at the mean of the rows of the pieces the tag text split into
    before: "<Path>" -> mean("<Path", ">") in Qwen's tokenizer. Rows of tags the tokenizer
    already had are left alone, since they may have been trained.
    """
    vocab = tokenizer.get_vocab()
    new_tags = [tag for tag in schema.all() if tag not in vocab]
    pieces = {tag: tokenizer.encode(tag, add_special_tokens=False) for tag in new_tags}
    if new_tags:
        tokenizer.add_tokens(new_tags, special_tokens=True)
    tag_ids = TagIds.from_tokenizer(tokenizer, schema)
    if model is not None:
        import torch  # here, not at the top: the text-only users of this file never need it

        _grow_embeddings(model, len(tokenizer))
        with torch.no_grad():
            for tag, piece_ids in pieces.items():
                row = tokenizer.convert_tokens_to_ids(tag)
                for weight in _embedding_matrices(model):
                    weight[row] = weight[piece_ids].mean(dim=0)  # [d]
    return tag_ids


def _embedding_matrices(model) -> list:
    """The input embedding matrix, plus the output one when it is not tied to it: [V, d] each."""
    weights = [model.get_input_embeddings().weight]
    output = model.get_output_embeddings()
    if output is not None and output.weight is not weights[0]:
        weights.append(output.weight)
    return weights


def _grow_embeddings(model, n_tokens: int) -> None:
    """Resize the embedding(s) to hold `n_tokens` rows (padded to 64); new rows = mean old row."""
    import torch

    old_rows = model.get_input_embeddings().weight.shape[0]
    if old_rows >= n_tokens:
        return
    # transformers fills the new rows at random (either way); we overwrite them so a reload,
    # which resizes again, gets the same rows without the adapter having to store the matrix.
    model.resize_token_embeddings(n_tokens, pad_to_multiple_of=64, mean_resizing=False)
    with torch.no_grad():
        for weight in _embedding_matrices(model):
            weight[old_rows:] = weight[:old_rows].mean(dim=0)  # [V_new - V_old, d]
