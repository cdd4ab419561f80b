"""nanopar: teach small Qwen models to think in parallel with reinforcement learning.

Reading order, the README's ("Read the code in this order" says a line per file), first the core:
one GRPO step, 2,400 lines (to the hundred), in the order a step meets it.
  tags.py      the tag schemas (<Parallel> <Path> <Summary>; NPR's <guideline> <plan> <step> <takeaway>)
  trace.py     the lenient reading of a trace into main chain / blocks / paths / summaries, and its stats
  layout.py    the structured ("Unseen") mask and multiverse positions, or causal ("Seen")
  policy.py    `Policy`: the one distribution the sampler draws from and the trainer reads
  kvcache.py   the sampler's cache of lanes: fork a row, merge the rows of a block
  sampler.py   the parallel-branch sampler: fork at <Parallel>, merge after the paths
  forward.py   the training read of a trace's log-probs
  grpo.py      `grpo_step`: sample -> reward -> drop invalid -> group advantages -> update
  rewards.py   the papers' rewards, what a step scores (by name: reward_registry.py; per step: reward_schedules.py)
Then the support files, when a question leads there:
  __init__.py  `NanoparError`, and this reading order
  format.py, grading.py, head.py, draw_in_place.py   what "valid" means; the final answer read and graded;
    the chunked read; the draw in fewer passes
  sft.py, optim.py   cold-start / self-distillation fine-tuning on traces; AdamW, its schedule, float16's loss scaler
  data.py, prompts.py, model.py (tag_rows.py, lora_dtype.py), wheels.py, tiny.py   what a run reads and loads
  merge.py, gguf_writer.py, export_check.py   a checkpoint as one plain model, as a GGUF, checked
  checkpoint.py, metrics.py, config.py, defaults.py   checkpoints, the log, flags, `resolve`
  curriculum.py (distill.py), runner.py (stage_steps.py, out_of_memory.py), dynamic_sampling.py, pass_rate.py,
    run_folder.py (trial.py), run_inputs.py, heldout.py, results.py   the run
  distributed.py   several processes under torchrun: shares of a step, sums over processes, rank 0 writes
  rollouts.py, evaluation.py, variance.py, eval_report.py, show.py   sampling + grading + summaries; trees, tables
  toy/         the toy world: the task (task.py), its teachers, its model and data (source.py)
  benchmarks/  the shipped data sets
And outside the library: train.py, ablations.py, sample.py, eval.py, export.py; bench/, tests/, docs/.
"""

__version__ = "0.1.0"


class NanoparError(Exception):
    """An error a user can fix (bad input, unknown model, bad flag): scripts print it as one line."""
