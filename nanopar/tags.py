"""The tag vocabulary of parallel thinking, kept in one place.

Parallel-R1's schema is the default:

    <Parallel> <Path> ... </Path> <Path> ... </Path> </Parallel> <Summary> ... </Summary>

Another schema (say NPR's or Multiverse's tag names) is a different `TagSchema` instance; the
format check, the parser, the layout and the sampler all take the schema as an argument.
`TagIds` is the same vocabulary as token ids, for code that works on ids (layout, sampler).
This file does not add tokens to a tokenizer; `model.add_tag_tokens` does.
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
                    "add the tags with nanopar.model.add_tag_tokens first"
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
