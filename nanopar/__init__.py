"""nanopar: teach small Qwen models to think in parallel with reinforcement learning.

Reading order, from the trace to the run (the README's file tree says one line per file):
  tags.py      the tag schemas (<Parallel> <Path> <Summary>; NPR's <guideline> <plan> <step> <takeaway>)
  format.py    the judges: Algorithm 1 of Parallel-R1, NPR's rules, what "a valid parallel trace" means
  trace.py     the lenient reading of a trace into main chain / blocks / paths / summaries, and its stats
  layout.py    the structured ("Unseen") mask and multiverse positions, or causal ("Seen")
  policy.py    `Policy`: the one distribution the sampler draws from and the trainer reads
  kvcache.py   the sampler's cache of lanes: fork a row, merge the rows of a block
  sampler.py   the parallel-branch sampler: fork at <Parallel>, merge after the paths
  forward.py   the training read of a trace's log-probs (head.py: the chunked LM-head read beside it)
  grpo.py      `grpo_step`: sample -> reward -> drop invalid -> group advantages -> update
  sft.py       cold-start / self-distillation fine-tuning on traces
  rewards.py, grading.py, data.py, prompts.py, model.py   what a step scores, reads and loads
               (tag_rows.py: the trainable tag rows read row by row, beside peft's copy of the matrix)
  curriculum.py  the stage recipes (distill.py: a stage that samples and keeps the traces worth training on)
  defaults.py  `resolve`: the one road from flags to a run's values (preset, real model, placeholders)
  runner.py    the stage loop (run_inputs.py: what a run reads; heldout.py: held-out evaluation)
  results.py   the table's numbers, read from a run folder's files (no model loads)
  distributed.py  several processes under torchrun: shares of a step, sums over processes, rank 0 writes
  evaluation.py, show.py   sampling + grading + summaries (eval_report.py: what eval.py adds); trees, tables
  toy/         the toy world: a task, a programmatic teacher, a tokenizer and model small enough for a CPU
Not here: the scripts (train.py, eval.py, sample.py, ablations.py) and the benchmarks (bench/).
"""

__version__ = "0.1.0"


class NanoparError(Exception):
    """An error a user can fix (bad input, unknown model, bad flag): scripts print it as one line."""
