"""The model card written beside a GGUF export: what the file is, how its layers were chosen,
how exact it is, and how to run it (llama.cpp, Ollama, llama.cpp's speculative decoding).

Plain Markdown with the Hugging Face front matter (``license``, ``base_model``, ``tags``), so
the folder can be uploaded to the Hub as it is.
"""

from __future__ import annotations

from typing import Any

from tss_opt.config.objectives import ACCEPT_LENGTH, COST, METRIC
from tss_opt.mapping.format import MappingEntry

__all__ = ["gguf_model_card"]


def _fmt(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _figures(info: dict[str, Any]) -> list[str]:
    """The mapping's figures of S* beside the dense run's, one Markdown table."""
    base = info.get("baseline") or {}
    rows = [
        ("accepted tokens per verification", info.get(ACCEPT_LENGTH), base.get(ACCEPT_LENGTH)),
        (f"task metric ({info.get('metric_name')})", info.get(METRIC), base.get(METRIC)),
        ("verification cost", info.get(COST), base.get(COST)),
    ]
    lines = ["| measured on the search's prompts | this sparse target | dense target |", "|---|---:|---:|"]
    lines += [f"| {name} | {_fmt(ours)} | {_fmt(dense)} |" for name, ours, dense in rows]
    return lines


def gguf_model_card(
    info: dict[str, Any],
    entry: MappingEntry,
    *,
    file_name: str,
    source_name: str | None,
    license_name: str | None,
) -> str:
    """The card's Markdown text.

    Args:
        info: The export's provenance record (the GGUF's ``tss.export``).
        entry: The mapping entry exported.
        file_name: The GGUF's file name (the card's commands use it).
        source_name: The source GGUF's ``general.name``.
        license_name: The source GGUF's ``general.license`` (the export inherits it).
    """
    domain = info["domain"]
    skip = list(info["skip_set"])
    n, k = int(info["source_layers"]), int(info["layers"])
    stem = file_name.removesuffix(".gguf")
    study = info.get("study") or {}
    front = ["---"]
    if license_name:
        front.append(f"license: {license_name}")
    front += [
        "tags: [gguf, llama.cpp, layer-skipping, tss-opt, sparse-target]",
        "---",
    ]
    if info["dense"]:
        what = (
            f"The search kept the dense target for `{domain}` (empty skip set): this is the unchanged {n}-layer "
            "model, which is what tss_opt serves the domain with."
        )
    else:
        what = (
            f"Decoder layers {skip} of {n} are deleted ({k} remain; block `j` of this file is source layer "
            f"`tss.kept_layers[j]`): the target that tss_opt serves `{domain}` prompts with, baked into a shorter "
            "model for engines that skip no layers per request."
        )
    if info["scope"] == "all":
        exact = (
            "The skip set was searched with `scope=all` (layers skipped in every forward, prompt included), which "
            "is what a model without the layers computes."
        )
    else:
        exact = (
            "**Warning:** the skip set was searched with `scope=verify` (dense prefill) and exported with "
            "`force=true`; this file skips the layers in the prefill too, so its outputs differ from the served "
            "target's."
        )
    outtype = info.get("outtype", "f32")
    if outtype == "f32":
        exact += (
            " Its tensors are the source's values in float32, the weights tss_opt's engine runs: llama.cpp's greedy "
            "tokens equal the engine's up to float32 rounding (two engines may flip a near-tie)."
        )
    else:
        exact += f" Its matrices are rounded to `{outtype}`; greedy outputs can differ from the float32 target's."
    if entry.lossy:
        exact += (
            f" The domain is served under the lossy rule `{entry.verification}`; an engine verifying exactly emits "
            "this file's own greedy tokens instead."
        )
    lines = [
        *front,
        "",
        f"# {stem}: {domain} sparse target of {source_name or info['source_model']}",
        "",
        what,
        "",
        "## How the layers were chosen",
        "",
        f"An Optuna search of tss_opt (target-side sparsification for speculative decoding) "
        f"over skip sets of the target, on `{domain}` prompts of the `{_fmt(info.get('split'))}` split, drafting with "
        f"`{_fmt(info.get('drafter'))}`: each trial measured how many drafted tokens the sparse target accepts per "
        "verification, the task metric and the verification cost; the selection rule "
        f"`{_fmt(info.get('selection'))}` chose this skip set among the feasible ones (study "
        f"`{_fmt(study.get('name'))}`).",
        "",
        *_figures(info),
        "",
        f"Sparsity {_fmt(info.get('sparsity'))}; scope `{info['scope']}`; verification `{_fmt(info.get('verification'))}`; "
        f"tensors `{outtype}` (1-D tensors stay f32); cut from `{info.get('source_gguf')}`.",
        "",
        "## Exactness",
        "",
        exact,
        "",
        "## Run it",
        "",
        "```bash",
        f"llama-cli -m {file_name}                     # chat in the terminal",
        f"llama-server -m {file_name} --port 8080      # OpenAI-compatible server",
        "# speculative decoding on top (flags of llama.cpp 2026): a draft model sharing the tokenizer,",
        "# or n-gram lookup in the context (no draft model)",
        f"llama-server -m {file_name} -md DRAFT.gguf --spec-draft-n-max 8",
        f"llama-server -m {file_name} --spec-type ngram-simple --spec-draft-n-max 8",
        f"llama-lookup -m {file_name} -p \"...\" -n 128 --spec-draft-n-max 8",
        "```",
        "",
        "Ollama (`ollama create " + stem.replace("_", "-") + " -f Modelfile`, then `ollama run "
        + stem.replace("_", "-") + "`), with this `Modelfile` beside the file:",
        "",
        "```",
        f"FROM ./{file_name}",
        "PARAMETER temperature 0",
        "```",
        "",
        "(Ollama reads the chat template from the file's `tokenizer.chat_template`.)",
        "",
        "## Provenance",
        "",
        "The file's metadata carries it: `tss.domain`, `tss.skip_set` (absent when dense: `tss.dense`), "
        "`tss.kept_layers`, `tss.scope`, `tss.source_model`, `tss.source_layers`, `tss.outtype`, the mapping's "
        "figures (`tss.accept_length`, `tss.metric`, `tss.metric_name`, `tss.cost`, `tss.sparsity`, "
        "`tss.baseline.*`, `tss.selection`, `tss.split`, `tss.drafter`, `tss.verification`, `tss.study.name`) and "
        "the whole record as JSON in `tss.export`. Read them with `gguf-dump " + file_name + "`.",
        "",
    ]
    return "\n".join(lines)
