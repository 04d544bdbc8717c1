"""One evaluation as a JSON document (``python -m tss_opt.cli.evaluate ... json_out=PATH``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tss_opt.evaluation.evaluator import EvalResult

__all__ = ["check_json_out", "result_document", "write_result_json"]


def check_json_out(path: str | Path) -> Path:
    """The output path, checked before a long evaluation runs.

    Raises:
        ValueError: if ``path`` is an existing folder.
    """
    out = Path(path).expanduser()
    if out.is_dir():
        raise ValueError(f"json_out={str(path)!r} is a folder; give a file path, e.g. {out / 'eval.json'}")
    return out


def result_document(result: EvalResult, context: dict[str, Any] | None = None) -> dict[str, Any]:
    """The aggregate figures and ``per_prompt`` of one skip set, ready for ``json.dump``.

    Args:
        result: the evaluation.
        context: what was evaluated (domain, model, split, ...), written first.

    Returns:
        ``{**context, "skip": [...], <the evaluator-contract keys>, "per_prompt": [...]}``;
        each ``per_prompt`` entry is the contract's mapping (``index``, ``id``,
        ``accept_length``, ``metric``, ``tokens``, ``steps``, ``repetition``,
        ``tokens_per_s``) plus the decoded ``output``.
    """
    doc: dict[str, Any] = dict(context or {})
    doc["skip"] = sorted(result.skip)
    body = result.to_dict()
    body.pop("per_prompt_score", None)  # the same numbers as per_prompt[i]["metric"]
    body["per_prompt"] = [{**p.to_dict(), "output": p.output} for p in result.prompts]
    doc.update(body)
    return doc


def write_result_json(path: str | Path, result: EvalResult, context: dict[str, Any] | None = None) -> Path:
    """Writes :func:`result_document` to ``path`` (parent folders created); returns the path.

    Raises:
        ValueError: if ``path`` is an existing folder.
    """
    out = check_json_out(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result_document(result, context), indent=1) + "\n", encoding="utf-8")
    return out
