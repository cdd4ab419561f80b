"""The final table of a run, written to <out>/results.md: the table the terminal shows, as Markdown."""

import json

from rich.table import Table

import train
from nanopar.curriculum import recipe, select
from nanopar.show import markdown

RUN = ["--pretrain-steps", "1", "--sft-steps", "1", "--sft-batch", "2", "--max-new-tokens", "40",
       "--max-path-tokens", "12", "--checkpoint-every", "0", "--eval-problems", "2", "--eval-samples", "1",
       "--stages", "pretrain,sft"]


def markdown_rows(text: str) -> list[list[str]]:
    """The cells of each row of the one Markdown table in `text`, the header first, the rule left out."""
    rows = [[cell.strip() for cell in line.strip().strip("|").split(" | ")] for line in text.splitlines()
            if line.startswith("|")]
    return [rows[0], *rows[2:]]


def test_a_run_writes_its_final_table_to_results_md_cell_for_cell(tmp_path):
    """Two stages of the toy (the second has a change over its start): results.md holds the
    printed table's title, columns and every cell, and its accuracy cells are the eval.json's."""
    args = ["--out", str(tmp_path), *RUN]
    out = train.main(args)
    config = train.resolved_config(args)[0]
    stages = recipe(config)
    table = train.summary(config, stages, select(stages, config.stages))
    text = (out / "results.md").read_text()
    assert text.startswith(f"**{table.title}**")
    rows = markdown_rows(text)
    assert rows[0] == [column.header for column in table.columns] == ["", "pretrain", "sft"]
    assert rows[1:] == [list(cells) for cells in zip(*(column.cells for column in table.columns))]
    names = [row[0] for row in rows]
    sft = json.loads((out / "2-sft" / "eval.json").read_text())["results"]["toy:easy:heldout"]
    assert rows[names.index("easy: accuracy")][2] == f"{sft['accuracy']:.1%}"
    assert rows[names.index("easy: vs its start")][2] != "-"  # sft against pretrain, paired


def test_a_cell_with_a_bar_stays_one_cell():
    table = Table(title="t")
    table.add_column("")
    table.add_column("a|b")
    table.add_row("row", "1 | 2")
    assert markdown(table) == "**t**\n\n|  | a\\|b |\n|---|---:|\n| row | 1 \\| 2 |\n"
