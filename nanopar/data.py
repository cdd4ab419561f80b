"""Problems: the unit of data every stage reads (SFT traces, RL prompts, evaluation).

(Being written: loading from JSON Lines / hub, prompts, shipped benchmark files.)
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Problem:
    id: str  # stable id: "<source>:<line>" or the data set's own id
    question: str  # the problem statement shown to the model
    answer: str  # the gold answer as the data set gives it (GSM8K: solution ending "#### 42")
    source: str = ""  # where it came from: a file path, a hub name, "toy-easy", ...
    extra: dict = field(default_factory=dict)  # any other fields of the record (e.g. a teacher trace)
