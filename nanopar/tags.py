"""The tag vocabulary of parallel thinking, kept in one place.

Parallel-R1's schema is the default:

    <Parallel> <Path> ... </Path> <Path> ... </Path> </Parallel> <Summary> ... </Summary>

Another schema (say NPR's or Multiverse's tag names) is a different `TagSchema` instance; the
format check, the parser, the layout and the sampler all take the schema as an argument.
`TagIds` is the same vocabulary as token ids, for code that works on ids (layout, sampler);
`add_tag_tokens` makes the tags single tokens of a tokenizer (and rows of a model's embedding).
Importing this file does not import torch (the format check and the rewards do without it).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, fields

from . import NanoparError


@dataclass(frozen=True)
class TagSchema:
    parallel_open: str = "<Parallel>"  # opens a block of independent paths
    parallel_close: str = "</Parallel>"  # closes the block; a summary must follow
    path_open: str = "<Path>"  # opens one path of the block
    path_close: str = "</Path>"  # closes that path
    summary_open: str = "<Summary>"  # opens the summary that merges the paths
    summary_close: str = "</Summary>"  # closes it; the main chain continues

    def all(self) -> tuple[str, ...]:
        """The six tags, in field order."""
        return tuple(getattr(self, f.name) for f in fields(self))


PARALLEL_R1 = TagSchema()


@dataclass(frozen=True)
class TagIds:
    """The six tags as token ids (each tag must be a single token)."""

    parallel_open: int
    parallel_close: int
    path_open: int
    path_close: int
    summary_open: int
    summary_close: int

    def all(self) -> tuple[int, ...]:
        return tuple(getattr(self, f.name) for f in fields(self))

    def names(self) -> dict[int, str]:
        """Token id -> field name ("parallel_open", ...): how the parser reads an id sequence."""
        return {getattr(self, f.name): f.name for f in fields(self)}

    @classmethod
    def from_tokenizer(cls, tokenizer, schema: TagSchema = PARALLEL_R1) -> "TagIds":
        """Look the tags up in a tokenizer; raise if one of them is not a single token."""
        ids = {}
        for f in fields(schema):
            tag = getattr(schema, f.name)
            encoded = tokenizer.encode(tag, add_special_tokens=False)
            if len(encoded) != 1:
                raise NanoparError(
                    f"tag {tag} is {len(encoded)} tokens in this tokenizer, not one; "
                    "add the tags with nanopar.tags.add_tag_tokens first"
                )
            ids[f.name] = encoded[0]
        return cls(**ids)


def find_tags(text: str, schema: TagSchema = PARALLEL_R1) -> list[tuple[int, int, str]]:
    """Every tag in `text`, in order, as (start, end, field name).

    >>> find_tags("a<Path>b</Path>")
    [(1, 7, 'path_open'), (8, 15, 'path_close')]
    """
    pattern, by_text = _tag_pattern(schema)
    return [(m.start(), m.end(), by_text[m.group()]) for m in pattern.finditer(text)]


@functools.cache
def _tag_pattern(schema: TagSchema) -> tuple[re.Pattern, dict[str, str]]:
    by_text = {getattr(schema, f.name): f.name for f in fields(schema)}
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
