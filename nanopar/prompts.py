"""Prompts: the instructions a model reads, the chat template around them, and when it stops.

The instructions and the question form one *user* message, instructions first, a blank line,
then the question (an optional `system` message goes before it). With a chat template (Qwen's),
the prompt ends with the assistant header `<|im_start|>assistant\\n`, so the first sampled token
starts the answer; without one (the toy's character tokenizer, `chat=False`) it is plain text,
"{instructions}\\n\\n{question}\\n".

Instruction sets, by the name `--instructions` gives them; each one a real model reads ends by
asking for the answer in a form the strict grader reads (a box, or a `Final Answer:` line):
  "parallel"  elicit parallel thinking: our wording of Parallel-R1's prompt in its tags
              (`parallel_instructions(schema)`), or of NPR's format rules under NPR's schema
  "plain"     step by step, no tags, the same answer line: the accuracy-only baselines
  "answer"    Qwen's own one-line request for a boxed answer: the least a real model must be told
  "none"      the bare question (a model trained on its own format: the toy's)
A data source with a model of its own words the sets its own way (`data.Source.instructions`:
the toy's model reads one marker, "in parallel"); a set it does not word is its "none" text.
Every prompt is built in these two steps, `instructions_named` (the words) then `build_prompt`
(the ids): training by `RunInputs.prompt`, held-out evaluation and its key by
`results.held_out_instructions`, eval.py and sample.py from their flags.
Not here: the tags as tokens (tags.add_tag_tokens), reading the answer (grading.py).
"""

from __future__ import annotations

from .data import Problem, source_for
from . import NanoparError
from .tags import NPR, PARALLEL_R1, TagSchema


# how Parallel-R1's and the plain instructions end: both readings of the strict grader accept it
# (Parallel-R1 asks for a `Final Answer:` line; the box makes the request the same as every other set's)
ANSWER_LINE = "End your response with a line of the form\nFinal Answer: \\boxed{<your answer>}"


def parallel_instructions(schema: TagSchema = PARALLEL_R1) -> str:
    """The parallel-thinking instructions, worded with `schema`'s tags (plain ASCII)."""
    s = schema
    if s.planned:
        return npr_instructions(s)
    return (
        "Work through the problem below step by step.\n"
        "\n"
        "Some steps are easier to get right when you look at them in more than one way: "
        "two different methods, separate cases, or an independent check of a result. "
        "At such a step, think in parallel:\n"
        f"1. Write {s.block_open}.\n"
        f"2. Write two or more paths, each as {s.path_open} ... {s.path_close}. "
        "The paths are written at the same time and none can see the others, so each one "
        "must stand on its own: never refer to another path or to an order between them.\n"
        f"3. Write {s.block_close}.\n"
        f"4. Right after it, write {s.summary_open} ... {s.summary_close}: a short account of "
        "what the paths found, where they agree and which result to carry on with.\n"
        "Then continue the solution.\n"
        "\n"
        "Decide for yourself where parallel thinking helps: use it at the steps that gain from "
        "it, as often as the problem needs, and reason normally elsewhere.\n"
        "\n"
        + ANSWER_LINE
    )


def npr_instructions(schema: TagSchema = NPR) -> str:
    """NPR's format rules in our own words (of its released prompt), with `schema`'s tags (a schema
    with plans); the answer in \\boxed{} as NPR asks."""
    s = schema
    return (
        "Solve the problem below in rounds. Each round has three parts, written in this order:\n"
        f"1. {s.block_open} with one or more plans inside, then {s.plans_close}. Each plan is "
        f"{s.plan_open}i: one sentence naming a way to take the next step{s.plan_close}, numbered "
        "from 1. Write as many plans as there are genuinely different ways forward; one plan is "
        "fine when the next step is simple.\n"
        f"2. One step per plan, in the same order: {s.path_open}i: carry out plan i{s.path_close}. "
        "The steps are written at the same time and none can see the others, so step i follows "
        "plan i only and never refers to another step.\n"
        f"3. {s.summary_open} ... {s.summary_close}: compare what the steps found, say which result "
        "holds and what to do next.\n"
        "Write nothing between these tags outside them. Start another round while the problem is "
        "not solved.\n"
        "\n"
        f"After the last {s.summary_close}, give the final answer in the form \\boxed{{<your answer>}}."
    )


PARALLEL_INSTRUCTIONS = parallel_instructions()
NPR_INSTRUCTIONS = npr_instructions()

PLAIN_INSTRUCTIONS = "Work through the problem below step by step, showing your reasoning.\n\n" + ANSWER_LINE

# Qwen's prompt for math (Qwen2.5-Math, and the Qwen3 model cards' advice), word for word
ANSWER_INSTRUCTIONS = "Please reason step by step, and put your final answer within \\boxed{}."


INSTRUCTIONS = {"parallel": PARALLEL_INSTRUCTIONS, "plain": PLAIN_INSTRUCTIONS, "answer": ANSWER_INSTRUCTIONS,
                "none": ""}  # by flag value


def instructions_named(name: str, data: str = "", schema: TagSchema = PARALLEL_R1) -> str:
    """The instructions a flag names ("parallel", "plain", "answer", "none"), as the model of
    `data` reads them: a registered source (`data.SOURCES`) may word them its own way (the toy
    world's model knows a one-word marker, not English paragraphs); a name it does not word gets
    its "none" text (its model keeps its own answer format). "parallel" is worded in `schema`'s tags.

    >>> instructions_named("answer")
    'Please reason step by step, and put your final answer within \\\\boxed{}.'
    >>> instructions_named("answer", "toy:easy"), instructions_named("parallel", "toy:easy")
    ('', 'in parallel')
    """
    if name not in INSTRUCTIONS:
        raise NanoparError(f"unknown instructions {name!r}: use one of {', '.join(INSTRUCTIONS)}")
    source = source_for(data) if data else None
    if source is not None and source.instructions is not None:
        return source.instructions.get(name, source.instructions.get("none", ""))
    return parallel_instructions(schema) if name == "parallel" else INSTRUCTIONS[name]


def build_prompt(
    problem: Problem | str,
    tokenizer,
    instructions: str = PARALLEL_INSTRUCTIONS,
    system: str | None = None,
    chat: bool = True,
) -> list[int]:
    """The token ids of the prompt for one problem (a `Problem` or the question text).

    `instructions=""` sends the bare question. `system` is a system message (chat form only);
    `None` leaves the template's default (Qwen2.5 adds its own, Qwen3 none). The plain form starts
    with the tokenizer's BOS where its own encoding adds one (Gemma, Llama: a base model without
    it writes garbage); a chat template writes its own.

    >>> from nanopar.tiny import char_tokenizer
    >>> tokenizer = char_tokenizer()
    >>> tokenizer.decode(build_prompt("1+1?", tokenizer, instructions="Add."))
    'Add.\\n\\n1+1?\\n'
    """
    question = problem.question if isinstance(problem, Problem) else problem
    content = f"{instructions}\n\n{question}" if instructions else question
    if chat and getattr(tokenizer, "chat_template", None):
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": content}
        ]
        return tokenizer.encode(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False),
                                add_special_tokens=False)
    text = content + "\n"
    ids, bos = tokenizer.encode(text, add_special_tokens=False), tokenizer.bos_token_id
    if bos is not None and tokenizer.encode(text)[:1] == [bos] != ids[:1]:
        ids = [bos] + ids
    return ids


def stop_ids(model, tokenizer) -> list[int]:
    """Token ids that end a response: the tokenizer's EOS, the model's generation-config EOS ids
    and, when the chat template closes turns with `<|im_end|>`, that token (Qwen chat: <|im_end|>
    151645 and <|endoftext|> 151643). The last covers a base model prompted in chat form, whose
    generation config knows only <|endoftext|>. `model` may be None.
    """
    ids = {tokenizer.eos_token_id}
    config_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids |= set(config_eos) if isinstance(config_eos, (list, tuple)) else {config_eos}
    if "<|im_end|>" in (getattr(tokenizer, "chat_template", None) or ""):
        end_of_turn = tokenizer.convert_tokens_to_ids("<|im_end|>")
        if end_of_turn != tokenizer.unk_token_id:
            ids.add(end_of_turn)
    return sorted(i for i in ids if i is not None)
