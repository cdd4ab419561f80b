"""nanopar: teach small Qwen models to think in parallel with reinforcement learning.

Reading order (each file is one concept):
  tags.py     the tag vocabulary (<Parallel> <Path> <Summary> and their closers)
  format.py   Algorithm 1 of Parallel-R1: the strict stack format check
  trace.py    parse a trace (text or token ids) into main chain / blocks / paths / summaries,
              and the trace statistics the papers report
  layout.py   the structured ("Unseen") attention mask and multiverse position ids, or the
              causal ("Seen") layout; shared by the sampler and the trainer
  model.py    load a model by hub id or folder, 4-bit NF4, LoRA, tags as tokens
  tiny.py     tiny Qwen2/Qwen3 models built from a config (tests, the toy world)
"""

__version__ = "0.1.0"


class NanoparError(Exception):
    """An error a user can fix (bad input, unknown model, bad flag): scripts print it as one line."""
