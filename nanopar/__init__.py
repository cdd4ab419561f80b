"""nanopar: teach small Qwen models to think in parallel with reinforcement learning.

Reading order (the README's "Read the code in this order" says more):
  runner.py   `Runner.train`: the loop in one screen (resume, step, log, checkpoint)
  grpo.py     `grpo_step`: sample -> reward -> group advantages -> drop invalid -> update
  tags.py     the tag vocabulary (<Parallel> <Path> <Summary> and their closers)
  format.py   Algorithm 1 of Parallel-R1: the strict stack format check
  trace.py    the lenient reading of a trace into main chain / blocks / paths / summaries
  layout.py   the structured ("Unseen") mask and multiverse positions, or causal ("Seen")
  policy.py   `Policy`: the one distribution the sampler draws from and the trainer reads
  sampler.py  the parallel-branch sampler: fork at <Parallel>, merge after the paths
  forward.py, sft.py, rewards.py, grading.py, data.py, prompts.py, model.py, curriculum.py
"""

__version__ = "0.1.0"


class NanoparError(Exception):
    """An error a user can fix (bad input, unknown model, bad flag): scripts print it as one line."""
