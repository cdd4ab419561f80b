"""A rollout as data: its JSON record and its structure, both read from its token ids.

    rollout_record(rollout, tokenizer)   ids, tag ids, text, sampled mask, log-probs, structure (token offsets), stats
    response_structure(rollout)          blocks, paths, positions, lengths, finish: what metrics average

A `sampler.Rollout` holds the ids the sampler wrote and the `trace.Trace` read from them; these two
functions are the one place that turns it into plain dicts: `rollout_record` for sample.py's
--json and an evaluation's samples.jsonl (`evaluation.sample_record` keeps it less what only
training needs), `response_structure` for `metrics.structure_metrics`, which a GRPO step and an
evaluation both call. The other shapes each have a reader these do not: `trace.TraceStats` is
any trace's reading, text or ids (show.py's tree, the sampler's critical path);
`sampler.RolloutStats` is what only decoding knows (sampled tokens, forks as made, cut paths,
wall time, cache size; it repeats the reading's length and critical path so a saved record's
stats stand alone); `sample_record` adds the grades and the problem. `response_structure` is
TraceStats under a record's key names plus the verdict of `format.check_parallel` and the
finish: trace.py cannot hold it (format.py reads trace.py).
Not here: sampling (sampler.py), reading a trace (trace.py), grading (evaluation.py),
drawing a rollout as a tree (show.py).
"""

from __future__ import annotations

from .format import check_parallel
from .tags import TagIds
from .trace import trace_stats


def rollout_record(rollout, tokenizer) -> dict:
    """A JSON-ready dict: ids, the tags' ids by role, text, sampled mask, log-probs, structure
    (token offsets), stats."""
    trace = rollout.trace
    return {
        "prompt": tokenizer.decode(rollout.prompt_ids, skip_special_tokens=False),
        "prompt_ids": rollout.prompt_ids,
        "ids": rollout.ids,
        "tag_ids": TagIds.from_tokenizer(tokenizer, trace.schema).roles(),  # with ids: the trace as sampled (record_trace)
        "text": tokenizer.decode(rollout.ids, skip_special_tokens=False),
        "sampled": rollout.sampled,
        "logprobs": rollout.logprobs,
        "finish": rollout.finish,
        "structure": {
            "main": [[m.start, m.end] for m in trace.main],
            "blocks": [
                {
                    "open": b.open,
                    "close": b.close,
                    "paths": [[p.start, p.end] for p in b.paths],
                    "summary": None if b.summary is None else [b.summary.start, b.summary.end],
                    "valid": b.valid,
                }
                for b in trace.blocks
            ],
            "stray": trace.stray,
            "truncated": trace.truncated,
        },
        "stats": vars(rollout.stats),
    }


def response_structure(rollout) -> dict:
    """One response's structure (token offsets), as an evaluation record stores it and `structure_metrics` reads it."""
    stats = trace_stats(rollout.trace)
    return {
        "has_parallel": check_parallel(rollout.trace).ok,  # a valid parallel trace: what parallel_ratio counts
        "blocks": stats.blocks,  # blocks read, valid or not
        "valid_blocks": stats.valid_blocks,
        "paths_per_block": stats.paths_per_block,
        "branches_per_block": stats.branches_per_block,  # NPR: plans per guideline
        "relative_positions": stats.relative_positions,  # offset of each <Parallel> / length
        "new_tokens": stats.length,  # response tokens, sampled and inserted
        "critical_path": stats.critical_path,  # tokens on the longest route through the blocks
        "finish": rollout.finish,  # "eos" or "length" (truncated)
    }
