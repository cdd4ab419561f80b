"""Algorithm 1 and the validity predicate (format.py), the lenient reading and the statistics (trace.py)."""

import random

import pytest

from conftest import PARALLEL_CASES, text_ids
from nanopar.format import check_format, check_released_format
from nanopar.tags import PARALLEL_R1, TagIds, TagSchema, find_tags
from nanopar.trace import parse_ids, parse_trace, trace_stats

BLOCK = "<Parallel><Path>a</Path><Path>b</Path></Parallel><Summary>s</Summary>"


@pytest.mark.parametrize(
    "text",
    [
        "no tags at all. Final Answer: 3",
        "x " + BLOCK + " y",
        BLOCK + BLOCK,
        "<Parallel>\n<Path>\n1</Path>\n<Path>2</Path>\n<Path>3</Path>\n</Parallel>\n<Summary>ok</Summary>",
        "a\n<Parallel>pre<Path>a</Path>gap<Path>b</Path>post</Parallel>text<Summary>s</Summary>",
    ],
)
def test_valid_traces(text):
    assert check_format(text).ok and check_format(text).reason == ""


@pytest.mark.parametrize(
    "text, reason",
    [
        # rule 1: a closing tag must match the top of the stack
        ("<Parallel><Path>a</Parallel></Path>", "</Parallel> closes <Path>"),
        ("a</Path>", "</Path> closes nothing"),
        ("<Summary>s</Path>", "</Path> closes <Summary>"),
        # rule 2: at least two paths per block
        ("<Parallel><Path>a</Path></Parallel><Summary>s</Summary>", "a <Parallel> block holds 1 <Path>; at least 2 are needed"),
        ("<Parallel></Parallel><Summary>s</Summary>", "a <Parallel> block holds 0 <Path>; at least 2 are needed"),
        ("<Parallel><Path>a<Path>b</Path></Path></Parallel><Summary>s</Summary>", "a <Parallel> block holds 1 <Path>; at least 2 are needed"),
        # rule 3: <Summary> is the next tag after </Parallel>
        ("<Parallel><Path>a</Path><Path>b</Path></Parallel>", "</Parallel> is not followed by <Summary>"),
        ("<Parallel><Path>a</Path><Path>b</Path></Parallel><Parallel>", "<Parallel> follows </Parallel>; expected <Summary>"),
        # rule 4: the stack is empty at the end
        ("<Parallel><Path>a</Path><Path>b</Path>", "<Parallel> is never closed"),
        (BLOCK + "<Summary>more", "<Summary> is never closed"),
        # rule 5: as many <Summary> as </Parallel>
        ("<Summary>s</Summary>", "1 <Summary> for 0 </Parallel>"),
        (BLOCK + "<Summary>again</Summary>", "2 <Summary> for 1 </Parallel>"),
    ],
)
def test_invalid_traces_name_the_broken_rule(text, reason):
    result = check_format(text)
    assert not result.ok and result.reason == reason


# Parallel-R1's released check (check_released_format) against Algorithm 1 as check_format reads it:
# (text, released passes?, check_format passes?), each verdict worked out by hand from the rules
RELEASED_VS_ALGORITHM_1 = {
    "a valid block": (BLOCK, True, True),
    "one path": ("<Parallel><Path>a</Path></Parallel><Summary>s</Summary>", False, False),
    "no summary": ("<Parallel><Path>a</Path><Path>b</Path></Parallel>x", False, False),
    "left open": ("<Parallel><Path>a</Path><Path>b", False, False),
    "a summary without a block": ("<Summary>s</Summary>", False, False),
    "no tags": ("Final Answer: 3", True, True),
    # where the released code is looser: <Summary> is never pushed, a path counts when it closes
    # inside a block at any depth, and a path between </Parallel> and <Summary> is not an error
    "the summary left open": ("<Parallel><Path>a</Path><Path>b</Path></Parallel><Summary>s", True, False),
    "a stray </Summary>": ("x</Summary>", True, False),
    "two paths, one nested": ("<Parallel><Path><Path>a</Path></Path></Parallel><Summary>s</Summary>", True, False),
    "a path before the summary": ("<Parallel><Path>a</Path><Path>b</Path></Parallel><Path>c</Path><Summary>s</Summary>",
                                  True, False),
}


@pytest.mark.parametrize("name", sorted(RELEASED_VS_ALGORITHM_1))
def test_the_released_check_is_looser_than_algorithm_1_in_four_places(name):
    text, released, algorithm_1 = RELEASED_VS_ALGORITHM_1[name]
    assert (check_released_format(text).ok, check_format(text).ok) == (released, algorithm_1)
    assert (check_released_format(text).reason == "") == released


def test_another_schema_plugs_in():
    schema = TagSchema("custom", "<P>", "</P>", "<T>", "</T>", "<S>", "</S>")
    assert check_format("<P><T>a</T><T>b</T></P><S>c</S>", schema).ok
    assert not check_format("<P><T>a</T></P><S>c</S>", schema).ok
    assert check_format("<Parallel>", schema).ok  # Parallel-R1 tags are plain text here


def test_parse_reads_blocks_paths_summaries_and_main():
    text = "ab<Parallel>p<Path>x</Path>\n<Path>yy</Path></Parallel>\n<Summary>s</Summary>end"
    trace = parse_trace(text)
    (block,) = trace.blocks
    assert text[block.open :].startswith("<Parallel>") and block.valid and trace.error is None
    assert [text[p.start : p.end] for p in block.paths] == ["<Path>x</Path>\n", "<Path>yy</Path>"]
    assert text[block.summary.start : block.summary.end] == "<Summary>s</Summary>"
    assert [text[m.start : m.end] for m in trace.main] == ["ab", "\n", "end"]


def test_parse_records_stray_tags_and_truncation():
    text = "</Path>a<Parallel><Path>x<Parallel>y"
    trace = parse_trace(text)
    assert trace.stray == [0, text.index("<Parallel>y")]  # blocks never nest
    assert trace.truncated and trace.blocks[0].paths[0].end == len(text)
    assert not trace.blocks[0].valid and trace.error.startswith("2 stray tag(s)")
    missing_summary = parse_trace(BLOCK.replace("<Summary>s</Summary>", "") + "then <Summary>late</Summary>")
    assert missing_summary.blocks[0].summary is not None  # text may sit between </Parallel> and <Summary>
    no_summary = parse_trace(BLOCK.replace("<Summary>s</Summary>", "") + "<Path>")
    assert no_summary.blocks[0].summary is None and not no_summary.blocks[0].valid and len(no_summary.stray) == 1


def test_stats_position_and_critical_path():
    # main 10 tokens, block at offset 10: paths of 4 and 7 tokens, summary 3, main 6: length 10+1+4+7+1+3+6
    ids = [1] * 10 + [100] + [102, 1, 1, 103] + [102] + [1] * 5 + [103] + [101] + [104, 1, 105] + [1] * 6
    stats = trace_stats(parse_ids(ids, TAG_IDS))
    assert stats.length == 32 and stats.blocks == 1 and stats.valid_blocks == 1
    assert stats.paths_per_block == [2] and stats.relative_positions == [10 / 32]
    assert stats.critical_path == 32 - 4 and stats.acceleration == pytest.approx(32 / 28)
    plain = trace_stats(parse_trace("no parallel here"))
    assert plain.blocks == 0 and plain.valid_blocks == 0 and plain.critical_path == plain.length
    assert plain.acceleration == 1.0


TAG_IDS = TagIds(100, 101, 102, 103, 104, 105)
TAGS = PARALLEL_R1.all()


def random_valid_trace(rng):
    """A random single-level valid trace and the path lengths (in tokens) of its blocks."""
    pieces, expected = [], []
    for _ in range(rng.randint(0, 3)):
        pieces += ["w"] * rng.randint(0, 3) + ["<Parallel>"] + ["w"] * rng.randint(0, 1)
        lengths = []
        for _ in range(rng.randint(2, 4)):
            body = ["w"] * rng.randint(0, 4)
            gap = ["w"] * rng.randint(0, 1)
            pieces += ["<Path>", *body, "</Path>", *gap]
            lengths.append(len(body) + 2 + len(gap))
        pieces += ["</Parallel>"] + ["w"] * rng.randint(0, 1) + ["<Summary>", "w", "</Summary>"]
        expected.append(lengths)
    return pieces + ["w"] * rng.randint(0, 3), expected


def as_ids(pieces):
    by_tag = dict(zip(TAGS, TAG_IDS.all()))
    return [by_tag.get(p, 7) for p in pieces]


def test_valid_traces_are_read_exactly_and_any_deleted_tag_breaks_them():
    rng = random.Random(0)
    for _ in range(1000):
        pieces, expected = random_valid_trace(rng)
        assert check_format("".join(pieces)).ok
        trace = parse_ids(as_ids(pieces), TAG_IDS)
        assert trace.error is None and all(b.valid for b in trace.blocks)
        assert [[len(p) for p in b.paths] for b in trace.blocks] == expected
        tag_at = [i for i, p in enumerate(pieces) if p in TAGS]
        if tag_at:
            drop = rng.choice(tag_at)
            assert not check_format("".join(pieces[:drop] + pieces[drop + 1 :])).ok


def test_tag_soup_never_raises_and_text_and_ids_agree():
    rng = random.Random(1)
    for _ in range(3000):
        pieces = [rng.choice(TAGS + ("w", "w\n")) for _ in range(rng.randint(0, 40))]
        text = "".join(pieces)
        check_format(text)  # must not raise
        by_ids = parse_ids(as_ids(pieces), TAG_IDS)
        by_text = parse_trace(text)
        # token index -> character offset: both readings must describe the same structure
        offset = [0]
        for p in pieces:
            offset.append(offset[-1] + len(p))
        assert [offset[s] for s in by_ids.stray] == by_text.stray
        assert by_ids.truncated == by_text.truncated and len(by_ids.blocks) == len(by_text.blocks)
        for a, b in zip(by_ids.blocks, by_text.blocks):
            assert offset[a.open] == b.open and a.valid == b.valid
            assert [(offset[p.start], offset[p.end]) for p in a.paths] == [(p.start, p.end) for p in b.paths]
        # every tag is read either as structure or as stray text
        structural = sum(
            1 + len(b.paths) + b.closed_paths + (b.close is not None) + (b.summary is not None) + b.summary_closed
            for b in by_ids.blocks
        )
        assert structural + len(by_ids.stray) == sum(p in TAGS for p in pieces)
        stats = trace_stats(by_ids)
        assert 0 < stats.critical_path <= stats.length or stats.length == 0
        assert all(0 <= r < 1 for r in stats.relative_positions)


def test_find_tags_prefers_whole_tags():
    assert [name for _, _, name in find_tags("<Path></Path><Parallel></Parallel>")] == [
        "path_open", "path_close", "block_open", "block_close"
    ]


# ----------------------------------------------------------------------------- one definition of a valid parallel trace


@pytest.mark.parametrize("name", sorted(PARALLEL_CASES))
def test_a_valid_parallel_trace_is_algorithm_1_and_a_clean_reading_with_a_valid_block(name):
    from nanopar.format import check_parallel

    text, valid, algorithm_1 = PARALLEL_CASES[name]
    assert check_format(text).ok == algorithm_1  # Algorithm 1 itself is unchanged
    assert check_parallel(text).ok == valid  # read from the text
    assert check_parallel(parse_trace(text)).ok == valid  # or given the reading
    assert check_parallel(parse_ids(text_ids(text, TAG_IDS), TAG_IDS)).ok == valid  # token ids read alike


def test_check_parallel_says_why_not():
    from nanopar.format import check_parallel

    reasons = {name: check_parallel(text).reason for name, (text, _, _) in PARALLEL_CASES.items()}
    assert reasons == {
        "clean": "",
        "path after the summary": "2 stray tag(s), first at offset 69",
        "nested path": "2 stray tag(s), first at offset 19",
        "truncated block": "<Path> is never closed",
        "one path": "a <Parallel> block holds 1 <Path>; at least 2 are needed",
        "sequential": "no valid parallel block",
    }


# ----------------------------------------------------------------------------- NPR's format: what its rejection keeps


def npr_format_passes(text: str) -> bool:
    """NPR's released format check (`compute_format_score` >= 0) as we read it, written anew for this
    test, less its two departures that `check_structured` documents (it does not read the "i:"
    labels; it fails short plans, steps and takeaways): with whitespace removed, the text is rounds
    <guideline>(<plan>…</plan>)+</guideline>(<step>…</step>)+<takeaway>…</takeaway>, one or more,
    as many steps as plans, nothing between the tags of a round, no tag outside a round."""
    import re

    squeezed = re.sub(r"\s+", "", text)
    inner = r"(?:(?!<).|<(?!/?(?:guideline|plan|step|takeaway)>))*"  # text with no tag of the schema
    round_ = rf"<guideline>((?:<plan>{inner}</plan>)+)</guideline>((?:<step>{inner}</step>)+)<takeaway>{inner}</takeaway>"
    outside = rf"{inner}"
    rounds = re.fullmatch(rf"{outside}(?:{round_}{outside})+", squeezed)
    if rounds is None:
        return False
    return all(m.group(1).count("<plan>") == m.group(2).count("<step>") for m in re.finditer(round_, squeezed))


def one_plan(trace: str) -> str:
    """Every round of an NPR trace cut to its first plan and first step."""
    import re

    trace = re.sub(r"(<guideline><plan>[^<]*</plan>)(?:<plan>[^<]*</plan>)+", r"\1", trace)
    return re.sub(r"(</guideline><step>[^<]*</step>)(?:<step>[^<]*</step>)+", r"\1", trace)


def test_npr_format_is_npr_check_one_plan_rounds_pass_and_a_tagless_answer_does_not():
    """`check_structured` under NPR against NPR's check written out, on the toy teacher's traces, the
    same cut to one plan per round, and each with one tag deleted or text put between two tags of a
    round (after <guideline>, </plan>, </guideline> or </step>)."""
    from nanopar.format import check_parallel, check_structured
    from nanopar.tags import NPR
    from nanopar.toy import npr_trace, toy_problems

    rng = random.Random(0)
    texts = []
    for problem in toy_problems("toy:easy")[:40]:
        trace = npr_trace(problem, rng)
        tags = find_tags(trace, NPR)
        start, end, _ = tags[rng.randrange(len(tags))]
        between = rng.choice([e for _, e, role in tags if role in ("block_open", "plan_close", "plans_close", "path_close")])
        texts += [trace, one_plan(trace), trace[:start] + trace[end:], trace[:between] + "so" + trace[between:]]
    verdicts = [(check_structured(t, NPR).ok, npr_format_passes(t)) for t in texts]
    assert all(ours == theirs for ours, theirs in verdicts), [t for t, v in zip(texts, verdicts) if v[0] != v[1]]
    assert sum(ours for ours, _ in verdicts) >= 80  # the traces and their one-plan cuts, at least
    single = one_plan(texts[0])
    assert check_structured(single, NPR).ok and not check_parallel(single, NPR).ok  # a round of one plan is NPR's format
    tagless = "2+2=4\nFinal Answer: 4"
    assert check_format(tagless, NPR).ok and check_structured(tagless, NPR).reason == "no <guideline>"


@pytest.mark.parametrize("text, reason", [
    ("<guideline><plan>1:a</plan></guideline><step>a</step><takeaway>t</takeaway>x", "step 1 does not open with '1:'"),
    ("<guideline><plan>1:a</plan></guideline><step>1:a", "<step> is never closed"),
    ("<guideline><plan>1:a</plan></guideline><step>1:a</step><takeaway>t</takeaway>", "no answer after the last </takeaway>"),
])
def test_npr_format_says_why_not(text, reason):
    from nanopar.format import check_structured
    from nanopar.tags import NPR

    assert check_structured(text, NPR).reason == reason


@pytest.mark.parametrize("name", sorted(PARALLEL_CASES))
def test_under_parallel_r1_the_format_with_a_block_is_a_valid_parallel_trace(name):
    from nanopar.format import check_parallel, check_structured

    text, valid, _ = PARALLEL_CASES[name]
    assert check_structured(text).ok == valid == check_parallel(text).ok
