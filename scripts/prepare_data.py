"""Build the shipped domain pools ``tss_opt/data/<domain>.jsonl`` from the public benchmark copies.

Run once by a developer, never at run time (the package must work without the source data):

    python scripts/prepare_data.py [SOURCE_DIR] [--out tss_opt/data]

``SOURCE_DIR`` (default ``../shared/data`` relative to the repository root) holds
``spec_bench/question.jsonl``, ``nq_open/NQ-open.dev.jsonl`` and ``mmlu/test/*.csv``. Every output
file is a pool of exactly 80 records ``{"id", "prompt", "references", ...extra fields}``; the
selection is deterministic (seed 42), so rerunning the script reproduces the files byte for byte.
``ATTRIBUTION.md`` is written next to them with each file's source, license and derivation.

It also writes ``tss_opt/data/train/<domain>.jsonl``: extra records for training drafters
(``python -m tss_opt.cli.train_drafter``), drawn from the same sources but disjoint from every
domain's pool (no record, and no question text, of any pool), so that a drafter trained on them
never sees a validation or held-out prompt. Only qa (more NQ-open dev questions) and mmlu (more
MMLU test questions) have such text; the Spec-Bench categories hold exactly their 80 prompts.
"""

from __future__ import annotations

import argparse
import ast
import csv
import hashlib
import json
import random
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

POOL_SIZE = 80
SEED = 42
# Extra training records per domain (tss_opt/data/train/): enough for a CPU training budget,
# small enough to ship (about 230 KB for qa, 350 KB for mmlu).
TRAIN_SIZES = {"qa": 1000, "mmlu": 300}
REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SOURCE = REPO_ROOT.parent / "shared" / "data"
DEFAULT_OUT = REPO_ROOT / "tss_opt" / "data"

SPEC_BENCH = "spec_bench/question.jsonl"
NQ_OPEN = "nq_open/NQ-open.dev.jsonl"
MMLU_DIR = "mmlu/test"
LETTERS = ("A", "B", "C", "D")

SOURCES = {
    "spec_bench": (
        "Spec-Bench, github.com/hemingkx/Spec-Bench, `data/spec_bench/question.jsonl` "
        "at commit fd2c1cd",
        "Apache-2.0",
    ),
    "nq_open": (
        "NQ-open dev set, github.com/google-research-datasets/natural-questions, "
        "`nq_open/NQ-open.dev.jsonl` (commit not recorded in the copy used)",
        "CC BY-SA 3.0",
    ),
    "mmlu": (
        "MMLU test set, github.com/hendrycks/test, `data/test/*.csv` at commit 785eba5",
        "MIT",
    ),
}


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Reads a JSONL file into a list of dicts, skipping blank lines."""
    with path.open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def spec_bench_category(rows: list[dict[str, Any]], category: str) -> list[dict[str, Any]]:
    """Returns the Spec-Bench rows of one category, in file order, checking there are 80."""
    selected = [r for r in rows if r["category"] == category]
    if len(selected) != POOL_SIZE:
        raise SystemExit(
            f"Spec-Bench category {category!r}: {len(selected)} rows, expected {POOL_SIZE}"
        )
    return selected


def _as_answer_list(value: Any) -> list[str]:
    """Flattens a Spec-Bench reference into a list of answer strings.

    The data README describes the rag reference as a Python-repr string to ``ast.literal_eval``;
    the copy actually holds a JSON list containing one list of answers (``[["a", "b"]]``).
    Both spellings are accepted so the script survives either version of the file.
    """
    if isinstance(value, str) and value.lstrip().startswith("["):
        value = ast.literal_eval(value)
    if isinstance(value, str):
        return [value]
    answers: list[str] = []
    for item in value:
        answers.extend(_as_answer_list(item))
    return answers


def build_spec_bench(rows: list[dict[str, Any]], category: str) -> list[dict[str, Any]]:
    """Translation, summarization and rag: ``turns[0]`` as the prompt, the reference as given."""
    records = []
    for row in spec_bench_category(rows, category):
        references = (
            _as_answer_list(row["reference"]) if category == "rag" else list(row["reference"])
        )
        if not references or not all(isinstance(r, str) and r for r in references):
            raise SystemExit(
                f"Spec-Bench {category} question {row['question_id']}: bad reference {row['reference']!r}"
            )
        records.append(
            {
                "id": f"{category}-{row['question_id']}",
                "prompt": row["turns"][0],
                "references": references,
                "source": "spec_bench",
                "question_id": str(row["question_id"]),
            }
        )
    return records


def _question_key(question: str) -> str:
    # Spec-Bench capitalises NQ questions and appends "?"; this undoes both for matching.
    return question.strip().rstrip("?").strip().lower()


def _as_spec_bench_question(question: str) -> str:
    # Filled-in NQ questions get Spec-Bench's spelling so all 80 prompts look alike.
    question = question.strip()
    return question[:1].upper() + question[1:] + ("" if question.endswith("?") else "?")


def build_qa(rows: list[dict[str, Any]], nq: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """QA: Spec-Bench qa questions found in NQ-open dev (in Spec-Bench order), then a seeded fill."""
    by_key: dict[str, int] = {}
    for index, record in enumerate(nq):
        by_key.setdefault(_question_key(record["question"]), index)
    records: list[dict[str, Any]] = []
    used: set[int] = set()
    for row in spec_bench_category(rows, "qa"):
        index = by_key.get(_question_key(row["turns"][0]))
        if index is None or index in used:
            continue
        used.add(index)
        records.append(
            {
                "id": f"qa-nq-dev-{index}",
                "prompt": row["turns"][0],
                "references": list(nq[index]["answer"]),
                "source": "spec_bench+nq_open",
                "question_id": str(row["question_id"]),
                "nq_question": nq[index]["question"],
            }
        )
    matched = len(records)
    rest = [i for i in range(len(nq)) if i not in used]
    for index in random.Random(SEED).sample(rest, POOL_SIZE - matched):
        records.append(
            {
                "id": f"qa-nq-dev-{index}",
                "prompt": _as_spec_bench_question(nq[index]["question"]),
                "references": list(nq[index]["answer"]),
                "source": "nq_open",
                "nq_question": nq[index]["question"],
            }
        )
    print(
        f"qa: {matched} Spec-Bench questions matched in NQ-open dev, {POOL_SIZE - matched} filled"
    )
    return records


def build_qa_train(
    nq: list[dict[str, Any]], pools: dict[str, list[dict[str, Any]]]
) -> list[dict[str, Any]]:
    """Extra qa training records: NQ-open dev questions outside the qa pool whose text appears
    in no pool prompt of any domain (rag prompts quote Natural Questions), spelled as the pool's."""
    used = {int(r["id"].rsplit("-", 1)[1]) for r in pools["qa"]}
    pool_text = "\n".join(r["prompt"].lower() for records in pools.values() for r in records)
    rest = [
        i
        for i in range(len(nq))
        if i not in used and _question_key(nq[i]["question"]) not in pool_text
    ]
    chosen = sorted(random.Random(SEED).sample(rest, TRAIN_SIZES["qa"]))
    print(f"qa train: {len(rest)} NQ-open dev questions outside every pool, {len(chosen)} drawn")
    return [
        {
            "id": f"qa-train-nq-dev-{index}",
            "prompt": _as_spec_bench_question(nq[index]["question"]),
            "references": list(nq[index]["answer"]),
            "source": "nq_open",
            "nq_question": nq[index]["question"],
        }
        for index in chosen
    ]


def mmlu_prompt(subject: str, question: str, choices: Iterable[str]) -> str:
    """The MMLU user message: subject line, question, lettered choices, answer instruction."""
    lines = [
        f"The following is a multiple choice question about {subject.replace('_', ' ')}.",
        "",
        question,
    ]
    lines += [f"{letter}. {choice}" for letter, choice in zip(LETTERS, choices, strict=True)]
    lines += ["", "Answer with the letter of the correct choice (A, B, C or D)."]
    return "\n".join(lines)


def read_mmlu(mmlu_dir: Path) -> list[tuple[str, int, list[str]]]:
    """All MMLU test rows ``(subject, row index, [question, A, B, C, D, answer])`` of the sorted
    CSV files."""
    rows: list[tuple[str, int, list[str]]] = []
    for path in sorted(mmlu_dir.glob("*_test.csv")):
        subject = path.name[: -len("_test.csv")]
        with path.open(newline="", encoding="utf-8") as fh:
            for row_index, row in enumerate(csv.reader(fh)):
                if len(row) != 6 or row[5] not in LETTERS:
                    raise SystemExit(
                        f"{path}:{row_index + 1}: expected question,A,B,C,D,answer; got {row!r}"
                    )
                rows.append((subject, row_index, row))
    return rows


def _mmlu_record(rows: list[tuple[str, int, list[str]]], i: int, prefix: str = "mmlu") -> dict[str, Any]:
    subject, row_index, row = rows[i]
    question, choices, answer = row[0], row[1:5], row[5]
    return {
        "id": f"{prefix}-{subject}-{row_index}",
        "prompt": mmlu_prompt(subject, question, choices),
        "references": [answer],
        "question": question,
        "choices": choices,
        "subject": subject,
    }


def build_mmlu(mmlu_dir: Path) -> list[dict[str, Any]]:
    """MMLU: 80 rows drawn with ``random.Random(42)`` from all test rows of the sorted CSV files."""
    rows = read_mmlu(mmlu_dir)
    chosen = sorted(random.Random(SEED).sample(range(len(rows)), POOL_SIZE))
    records = [_mmlu_record(rows, i) for i in chosen]
    print(f"mmlu: {len(rows)} rows, {len({r['subject'] for r in records})} subjects in the sample")
    return records


def build_mmlu_train(mmlu_dir: Path, pool: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Extra mmlu training records: test rows outside the pool whose question text differs
    from every pool question (MMLU repeats some questions across rows and subjects)."""
    rows = read_mmlu(mmlu_dir)
    pool_ids = {r["id"] for r in pool}
    pool_questions = {r["question"].strip().lower() for r in pool}
    rest = [
        i
        for i, (subject, row_index, row) in enumerate(rows)
        if f"mmlu-{subject}-{row_index}" not in pool_ids
        and row[0].strip().lower() not in pool_questions
    ]
    # A separate stream from the pool's draw (seed + 1): the pool's selection stays as it was.
    chosen = sorted(random.Random(SEED + 1).sample(rest, TRAIN_SIZES["mmlu"]))
    print(f"mmlu train: {len(rest)} rows outside the pool, {len(chosen)} drawn")
    return [_mmlu_record(rows, i, prefix="mmlu-train") for i in chosen]


def write_jsonl(path: Path, records: list[dict[str, Any]], size: int = POOL_SIZE) -> None:
    """Writes one JSON object per line (UTF-8, no ASCII escaping), checking the record count."""
    if len(records) != size or len({r["id"] for r in records}) != size:
        raise SystemExit(f"{path.name}: {len(records)} records / unique ids, expected {size}")
    with path.open("w", encoding="utf-8", newline="\n") as fh:
        for record in records:
            fh.write(json.dumps(record, ensure_ascii=False) + "\n")


def sha256(*paths: Path) -> str:
    """The sha256 of the concatenated bytes of ``paths`` (several for the MMLU CSV folder)."""
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.read_bytes())
    return digest.hexdigest()


DERIVATIONS = {
    "translation": (
        ["spec_bench"],
        "The 80 Spec-Bench `translation` rows (WMT14 de-en) in file order; `prompt` = `turns[0]` "
        "unchanged (it contains the instruction); `references` = the `reference` list (one "
        "Moses-tokenized English string).",
    ),
    "summarization": (
        ["spec_bench"],
        "The 80 Spec-Bench `summarization` rows (CNN/DailyMail) in file order; `prompt` = "
        "`turns[0]` unchanged; `references` = the `reference` list (the highlights).",
    ),
    "rag": (
        ["spec_bench"],
        "The 80 Spec-Bench `rag` rows (passages + question) in file order; `prompt` = `turns[0]` "
        "unchanged; `references` = the flattened list of acceptable answers (the copy stores "
        "`[[answer, ...]]`; a Python-repr string would be parsed with `ast.literal_eval`).",
    ),
    "qa": (
        ["spec_bench", "nq_open"],
        "First the Spec-Bench `qa` questions (which ship without references) that appear in "
        "NQ-open dev up to capitalisation and the trailing `?`, in Spec-Bench order, with "
        "Spec-Bench's spelling as `prompt`; then the pool is filled to 80 with "
        "`random.Random(42).sample` of the remaining NQ-open dev records (file order), "
        "spelled the same way (first letter capitalised, `?` appended). `references` = all NQ "
        "answers; `nq_question` keeps the original question. Derived from CC BY-SA 3.0 data, "
        "so this file is distributed under CC BY-SA 3.0.",
    ),
    "mmlu": (
        ["mmlu"],
        "All 14,079 rows of the 57 test CSVs read in sorted file-name order; 80 row positions "
        "drawn with `random.Random(42).sample` and kept in file order. Fields `question`, "
        "`choices` (A-D texts), `subject`; `references` = [answer letter]; `prompt` = a subject "
        "line, the question, the lettered choices `A. ...` and an instruction to answer with "
        "the letter.",
    ),
}


TRAIN_DERIVATIONS = {
    "qa": (
        ["nq_open"],
        f"{TRAIN_SIZES['qa']} NQ-open dev records drawn with `random.Random(42).sample` (kept in "
        "file order) from those that are not in `qa.jsonl` and whose question (lower-cased, "
        "without `?`) occurs in no prompt of any shipped pool (rag prompts quote Natural "
        "Questions); spelled as `qa.jsonl` (first letter capitalised, `?` appended). Derived "
        "from CC BY-SA 3.0 data, so this file is distributed under CC BY-SA 3.0.",
    ),
    "mmlu": (
        ["mmlu"],
        f"{TRAIN_SIZES['mmlu']} MMLU test rows drawn with `random.Random(43).sample` (kept in file "
        "order) from the rows that are not in `mmlu.jsonl` and whose question text differs from "
        "every question of `mmlu.jsonl`; same fields and prompt as `mmlu.jsonl`.",
    ),
}


def write_attribution(out_dir: Path, input_digests: dict[str, str]) -> None:
    """Writes ATTRIBUTION.md: per output file its source, license, derivation and checksums."""
    lines = [
        "# Shipped evaluation data: sources and licenses",
        "",
        "Generated by `scripts/prepare_data.py` (do not edit by hand; rerun the script). Each file",
        f"is a pool of {POOL_SIZE} records `{{id, prompt, references, ...}}`; the protocol shuffles it",
        "with seed 42 into 16 calibration, 16 validation and 48 held-out prompts at load time.",
        "",
        "## Sources",
        "",
    ]
    for key, (desc, license_) in SOURCES.items():
        lines.append(
            f"- **{key}**: {desc}. License: {license_}. Input sha256 `{input_digests[key]}`."
        )
    lines += [
        "",
        "Spec-Bench redistributes prompts that derive from WMT14 (translation), CNN/DailyMail",
        "(summarization) and Natural Questions (rag); see those projects for their own terms.",
        "",
        "## Files",
        "",
    ]
    for name, (sources, how) in DERIVATIONS.items():
        path = out_dir / f"{name}.jsonl"
        licenses = " + ".join(SOURCES[s][1] for s in sources)
        lines += [
            f"### `{name}.jsonl`",
            "",
            f"- Source: {', '.join(sources)}; license: {licenses}.",
            f"- Size: {path.stat().st_size} bytes; sha256 `{sha256(path)}`.",
            f"- Derivation: {how}",
            "",
        ]
    lines += [
        "## Drafter training text (`train/`)",
        "",
        "Extra records of the qa and mmlu domains for `python -m tss_opt.cli.train_drafter`",
        "(the domain configs' `train_data`), disjoint from every pool above: none of them is a",
        "calibration, validation or held-out prompt of any domain (a test checks this).",
        "",
    ]
    for name, (sources, how) in TRAIN_DERIVATIONS.items():
        path = out_dir / "train" / f"{name}.jsonl"
        licenses = " + ".join(SOURCES[s][1] for s in sources)
        lines += [
            f"### `train/{name}.jsonl`",
            "",
            f"- Source: {', '.join(sources)}; license: {licenses}.",
            f"- Size: {path.stat().st_size} bytes; sha256 `{sha256(path)}`.",
            f"- Derivation: {how}",
            "",
        ]
    (out_dir / "ATTRIBUTION.md").write_text("\n".join(lines), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "source", nargs="?", type=Path, default=DEFAULT_SOURCE, help="benchmark data folder"
    )
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help="output folder (tss_opt/data)"
    )
    args = parser.parse_args(argv)
    source: Path = args.source
    inputs = {
        "spec_bench": source / SPEC_BENCH,
        "nq_open": source / NQ_OPEN,
        "mmlu": source / MMLU_DIR,
    }
    for path in inputs.values():
        if not path.exists():
            parser.error(
                f"{path} not found; pass the folder holding spec_bench/, nq_open/ and mmlu/"
            )
    spec_bench = read_jsonl(inputs["spec_bench"])
    nq = read_jsonl(inputs["nq_open"])
    pools = {
        "translation": build_spec_bench(spec_bench, "translation"),
        "summarization": build_spec_bench(spec_bench, "summarization"),
        "rag": build_spec_bench(spec_bench, "rag"),
        "qa": build_qa(spec_bench, nq),
        "mmlu": build_mmlu(inputs["mmlu"]),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    for name, records in pools.items():
        write_jsonl(args.out / f"{name}.jsonl", records)
        print(
            f"{name}.jsonl: {len(records)} records, {(args.out / f'{name}.jsonl').stat().st_size} bytes"
        )
    train = {
        "qa": build_qa_train(nq, pools),
        "mmlu": build_mmlu_train(inputs["mmlu"], pools["mmlu"]),
    }
    (args.out / "train").mkdir(exist_ok=True)
    for name, records in train.items():
        path = args.out / "train" / f"{name}.jsonl"
        write_jsonl(path, records, size=TRAIN_SIZES[name])
        print(f"train/{name}.jsonl: {len(records)} records, {path.stat().st_size} bytes")
    digests = {
        "spec_bench": sha256(inputs["spec_bench"]),
        "nq_open": sha256(inputs["nq_open"]),
        # A folder: the digest of its sorted CSV files concatenated.
        "mmlu": sha256(*sorted(inputs["mmlu"].glob("*_test.csv"))),
    }
    write_attribution(args.out, digests)
    return 0


if __name__ == "__main__":
    sys.exit(main())
