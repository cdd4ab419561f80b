"""The scripted sampler evaluation tests run on, and the responses they script.

`scripted(monkeypatch, tokenizer, rows)` replaces the sampler that `nanopar.evaluation` and
`nanopar.eval_report` call with one that returns fixed responses, built as the sampler builds
rollouts, so evaluate(), eval.py and the summaries can be checked against hand counts without a
model. `SCRIPT` and `FLEXIBLE_SCRIPT` are the responses (toy, GSM8K, AIME) both
test_evaluation.py and test_eval_cli.py score. Not a test module (pytest collects test_*.py only).
"""

from conftest import text_rollout
from nanopar import eval_report, evaluation
from nanopar.data import load_problems
from nanopar.policy import Policy
from nanopar.prompts import INSTRUCTIONS, NPR_INSTRUCTIONS, build_prompt, instructions_named
from nanopar.tags import TagIds
from nanopar.toy import toy_tokenizer


NO_TAGS = TagIds(-1, -2, -3, -4, -5, -6)  # sequential decoding: no id is a tag
POLICY = Policy.for_tokenizer(toy_tokenizer())  # the toy tokenizer's tags and vocabulary


class Scripted:
    """A stand-in for `sampler.sample` returning scripted responses, as the sampler would build them.

    `script` maps a problem's prompt ids to (text, finish) pairs, one per sample; "eos" appends EOS.
    `wall_time` is every call's wall time, or a list of them, one per call in order.
    """

    def __init__(self, tokenizer, script: dict[tuple, list[tuple[str, str]]], wall_time: float | list = 0.25):
        self.tokenizer, self.script, self.wall_time, self.calls = tokenizer, script, wall_time, []

    def __call__(self, model, prompts, policy, settings, eos_ids, samples_per_prompt=1):
        tag_ids = policy.tag_ids
        self.calls.append({"prompts": prompts, "seed": settings.seed, "tag_ids": tag_ids,
                           "samples": samples_per_prompt})
        wall_time = self.wall_time.pop(0) if isinstance(self.wall_time, list) else self.wall_time
        rollouts = []
        for prompt in prompts:
            for text, finish in self.script[tuple(prompt)][:samples_per_prompt]:
                ids = self.tokenizer.encode(text, add_special_tokens=False)
                ids += [eos_ids[0]] if finish == "eos" else []
                rollouts.append(text_rollout(prompt, ids, tag_ids or NO_TAGS, finish, wall_time))
        return rollouts


# every prompt text a problem can be given (each set as real data and as the toy words it): the
# script answers a problem the same whatever its instructions
PROMPT_TEXTS = {instructions_named(name, data) for name in INSTRUCTIONS for data in ("", "toy:easy")} | {NPR_INSTRUCTIONS}


def scripted(monkeypatch, tokenizer, table: list[tuple], wall_time: float | list = 0.25) -> Scripted:
    """Patch the sampler evaluation and eval_report use with `table` rows (problem, text, finish)."""
    rows: dict[int, tuple] = {}
    for problem, text, finish in table:
        rows.setdefault(id(problem), (problem, []))[1].append((text, finish))
    script = {tuple(build_prompt(problem, tokenizer, instructions=instructions)): answers
              for problem, answers in rows.values() for instructions in PROMPT_TEXTS}
    fake = Scripted(tokenizer, script, wall_time)
    monkeypatch.setattr(evaluation, "sample", fake)
    monkeypatch.setattr(eval_report, "sample", fake)
    return fake


# ----------------------------------------------------------------------------- scripted responses

PROBLEMS = {p.id: p for name in ("gsm8k", "math500", "aime24", "aime25", "amc23")
            for p in load_problems(name, limit=3)}

TOY = load_problems("toy:easy:heldout", limit=1)[0]  # numbers 1 7 1 target 8, answer (7+1)*1
TOY_PARALLEL = "<Parallel><Path>7+1=8,8*1=8vs8yes</Path><Path>7*1=7,7+1=8vs8yes</Path></Parallel>" \
               "<Summary>7+1=8,8*1=8vs8yes</Summary>\nFinal Answer: (7+1)*1"
SCRIPT = [  # (problem, response, finish, correct)
    (TOY, TOY_PARALLEL, "eos", True),
    (TOY, "7+1=8vs8yes\nFinal Answer: 7+1", "eos", False),  # 1 is unused: wrong
    (TOY, "<Parallel><Path>7+1=8", "length", False),  # cut off inside a path: no answer
    (PROBLEMS["gsm8k:1"], "Final Answer: 18", "eos", True),
    (PROBLEMS["gsm8k:1"], r"ab<Parallel><Path>x</Path><Path>y</Path></Parallel><Summary>s</Summary>\boxed{18}", "eos", True),
    (PROBLEMS["gsm8k:1"], "Final Answer: 17</Path>", "eos", False),  # a stray tag; the answer stops at it
    (PROBLEMS["aime24:1"], r"\boxed{204}", "eos", True),
    (PROBLEMS["aime24:1"], "<Parallel><Path>204</Path></Parallel><Summary>2</Summary>Final Answer: 2", "eos", False),
    (PROBLEMS["aime24:1"], "I do not know", "length", False),
]

GSM_18, GSM_70000 = PROBLEMS["gsm8k:1"], PROBLEMS["gsm8k:3"]  # golds "... #### 18", "... #### 70000"
# (problem, response, strict: correct, found; flexible: correct, read as): GSM8K-style answers
FLEXIBLE_SCRIPT = [
    (GSM_18, "Janet sells 16 - 3 - 4 = 9 eggs a day at $2 each.\n#### 18", (False, False), (True, "####")),
    (GSM_18, "She makes 9 * 2 = 18 dollars.", (False, False), (True, "last number")),
    (GSM_18, "She makes 9 * 2 = 18 dollars.\nFinal Answer: \\boxed{18}", (True, True), (True, "boxed")),
    (GSM_18, "She makes $16.", (False, False), (False, "last number")),  # the maths is wrong
    (GSM_70000, "The profit is $70,000.", (False, False), (True, "last number")),
    (GSM_70000, "Final Answer: 7000", (False, True), (False, "final answer")),  # strict found it: the same
    (GSM_70000, "<Parallel><Path>70,000</Path><Path>70,000</Path></Parallel><Summary>they agree</Summary>",
     (False, False), (False, None)),  # numbers in paths only: no answer either way
    (GSM_70000, "I am not sure.", (False, False), (False, None)),
]
