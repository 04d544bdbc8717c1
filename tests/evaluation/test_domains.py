"""Shipped domains, the TSS splits, user domains as YAML + JSONL, bad input, prompt formatting."""

from __future__ import annotations

import importlib.util
import json
import random
from pathlib import Path
from typing import Any

import pytest
import torch
from omegaconf import OmegaConf

from tss_opt.evaluation.domains import (
    Domain,
    DomainConfig,
    DomainError,
    Example,
    available_domains,
    format_prompt,
    load_domain,
    read_domain_config,
)
from tss_opt.evaluation.metrics import Metric, _registry, register_metric

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
SHIPPED = {
    "mmlu": "mmlu_accuracy",
    "qa": "token_f1",
    "rag": "token_f1",
    "summarization": "rouge_l",
    "translation": "bleu",
}


def write_jsonl(path: Path, records: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def records(n: int, **extra: Any) -> list[dict[str, Any]]:
    return [
        {"id": f"r{i}", "prompt": f"prompt {i}", "references": [f"ref {i}"], **extra}
        for i in range(n)
    ]


def small_config(data: Path | str, **overrides: Any) -> dict[str, Any]:
    cfg = {
        "name": "tiny",
        "data": str(data),
        "metric": "token_f1",
        "calibration_size": 2,
        "validation_size": 0,
        "heldout_size": 3,
    }
    return {**cfg, **overrides}


# --- shipped domains ------------------------------------------------------------------------------


def test_available_domains() -> None:
    assert available_domains([CONF_DIR]) == sorted(SHIPPED)


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shipped_domain_loads_with_protocol_splits(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # builtin data must not depend on the working directory
    cfg = OmegaConf.load(CONF_DIR / "domain" / f"{name}.yaml")
    assert set(cfg) == set(DomainConfig.__dataclass_fields__)  # every key spelled out
    domain = load_domain(cfg)
    assert domain.name == name
    assert domain.config.metric == SHIPPED[name]
    assert domain.metric.name == SHIPPED[name]
    assert (domain.config.max_new_tokens, domain.config.shuffle_seed) == (96, 42)
    assert len(domain.pool) == 80
    assert len({ex.id for ex in domain.pool}) == 80
    assert all(ex.references and all(r.strip() for r in ex.references) for ex in domain.pool)
    assert all(ex.prompt.strip() for ex in domain.pool)

    calibration, validation = domain.split("calibration"), domain.split("validation")
    heldout = domain.split("heldout")
    assert (len(calibration), len(validation), len(heldout)) == (16, 16, 48)
    ids = [{ex.id for ex in split} for split in (calibration, validation, heldout)]
    assert len(ids[0] | ids[1] | ids[2]) == 80  # disjoint, and together the whole pool
    # Exactly the protocol: shuffle the file order with Random(42), 16, 16, then 48;
    # calibration is the paper's first 16.
    order = [ex.id for ex in domain.pool]
    random.Random(42).shuffle(order)
    assert [ex.id for ex in calibration] == order[:16]
    assert [ex.id for ex in validation] == order[16:32]
    assert [ex.id for ex in heldout] == order[32:80]
    again = load_domain(cfg)
    assert again.split("calibration") == calibration and again.split("heldout") == heldout
    assert again.split("validation") == validation


def test_mmlu_records_carry_choices_and_letter() -> None:
    domain = load_domain(read_domain_config("mmlu", [CONF_DIR]))
    for ex in domain.pool:
        assert ex.references in {("A",), ("B",), ("C",), ("D",)}
        assert len(ex.fields["choices"]) == 4 and ex.fields["subject"]
        for letter, choice in zip("ABCD", ex.fields["choices"], strict=True):
            assert f"\n{letter}. {choice}" in ex.prompt
        assert "Answer with the letter" in ex.prompt


def test_qa_starts_with_spec_bench_questions() -> None:
    domain = load_domain(read_domain_config("qa", [CONF_DIR]))
    sources = [ex.fields["source"] for ex in domain.pool]
    assert sources == ["spec_bench+nq_open"] * 43 + ["nq_open"] * 37
    assert domain.pool[0].prompt == "Who played anna in once upon a time?"


def test_split_rejects_unknown_name() -> None:
    domain = load_domain(read_domain_config("qa", [CONF_DIR]))
    with pytest.raises(
        DomainError, match="Unknown split 'test'; expected one of: calibration, validation, heldout"
    ):
        domain.split("test")  # type: ignore[arg-type]


# --- user domains -----------------------------------------------------------------------------


def test_user_domain_from_yaml_and_jsonl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    conf = tmp_path / "my_conf"
    (conf / "domain").mkdir(parents=True)
    data = [
        {
            "id": f"case-{i}",
            "question": f"Who won case {i}?",
            "context": f"Ruling {i}.",
            "references": [f"party {i}"],
        }
        for i in range(12)
    ]
    write_jsonl(tmp_path / "legal.jsonl", data)
    (conf / "domain" / "legal.yaml").write_text(
        "name: legal\n"
        "data: legal.jsonl\n"  # relative to the current directory
        'prompt_template: "{context}\\n\\nQuestion: {question}"\n'
        "system_prompt: You are a careful lawyer.\n"
        "metric: token_f1\n"
        "extra_metrics: [exact_match]\n"
        "pool_size: 10\n"
        "calibration_size: 4\n"
        "validation_size: 2\n"
        "heldout_size: 4\n"
    )
    monkeypatch.chdir(tmp_path)
    assert available_domains([conf, CONF_DIR]) == ["legal", *sorted(SHIPPED)]
    domain = load_domain(OmegaConf.load(conf / "domain" / "legal.yaml"))
    assert [ex.id for ex in domain.pool] == [f"case-{i}" for i in range(10)]  # pool_size truncation
    assert domain.pool[3] == Example(
        id="case-3",
        prompt="Ruling 3.\n\nQuestion: Who won case 3?",
        references=("party 3",),
        fields=data[3],
    )
    assert domain.config.system_prompt == "You are a careful lawyer."
    assert domain.config.max_new_tokens == 96  # defaults fill omitted keys
    assert [m.name for m in domain.extra_metrics] == ["exact_match"]
    assert [len(domain.split(s)) for s in ("calibration", "validation", "heldout")] == [4, 2, 4]
    assert read_domain_config("legal", [conf]) == domain.config


def test_load_domain_accepts_dataclass_and_dict(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", records(5))
    from_dict = load_domain(small_config(path))
    from_dataclass = load_domain(DomainConfig(**small_config(path)))
    assert from_dict.pool == from_dataclass.pool
    assert isinstance(from_dict, Domain) and from_dict.config == from_dataclass.config


def test_reference_free_metric_allows_records_without_references(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_registry, "_REGISTRY", dict(_registry._REGISTRY))
    register_metric(Metric("words", lambda p, r: float(len(p.split())), needs_references=False))
    path = write_jsonl(tmp_path / "d.jsonl", [{"id": str(i), "prompt": "p"} for i in range(5)])
    domain = load_domain(small_config(path, metric="words"))
    assert all(ex.references == () for ex in domain.pool)


def test_read_domain_config_unknown_name_suggests() -> None:
    with pytest.raises(
        DomainError, match=r"Unknown domain 'qaa'\. Did you mean 'qa'\? Available: mmlu, qa"
    ):
        read_domain_config("qaa", [CONF_DIR])


# --- bad input ----------------------------------------------------------------------------------


def test_missing_data_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(DomainError, match=r"data file .*nope\.jsonl.* not found"):
        load_domain(small_config(missing))


def test_unknown_builtin_file() -> None:
    with pytest.raises(
        DomainError, match=r"no built-in data file 'legal\.jsonl'\. Shipped: mmlu\.jsonl"
    ):
        load_domain({"name": "x", "data": "builtin:legal.jsonl"})


@pytest.mark.parametrize("content", ["", "\n  \n"])
def test_empty_data_file(tmp_path: Path, content: str) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text(content)
    with pytest.raises(DomainError, match=r"empty\.jsonl: no records"):
        load_domain(small_config(path))


def test_malformed_line_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    good = [json.dumps(r) for r in records(5)]
    path.write_text("\n".join([good[0], good[1], '{"id": "x", "prompt": ', *good[2:]]) + "\n")
    with pytest.raises(DomainError, match=r"bad\.jsonl:3: malformed JSON"):
        load_domain(small_config(path))


def test_non_object_line(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "list.jsonl", [*records(3), ["not", "an", "object"]])
    with pytest.raises(
        DomainError, match=r"list\.jsonl:4: expected a JSON object per line, got list"
    ):
        load_domain(small_config(path))


def test_record_without_prompt(tmp_path: Path) -> None:
    rows = records(6)
    del rows[4]["prompt"]
    path = write_jsonl(tmp_path / "noprompt.jsonl", rows)
    with pytest.raises(DomainError, match=r"noprompt\.jsonl:5: record 'r4' has no field 'prompt'"):
        load_domain(small_config(path))


def test_record_without_template_field(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", records(6))
    with pytest.raises(DomainError, match=r"d\.jsonl:1: record 'r0' has no field 'context'"):
        load_domain(small_config(path, prompt_template="{context}: {prompt}"))


@pytest.mark.parametrize(
    ("template", "match"),
    [("{prompt", "not a valid str.format template"), ("{} {0}", "positional field")],
)
def test_malformed_template(tmp_path: Path, template: str, match: str) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", records(6))
    with pytest.raises(DomainError, match=match):
        load_domain(small_config(path, prompt_template=template))


@pytest.mark.parametrize("key", ["metric", "extra_metrics"])
def test_unknown_metric_lists_available(tmp_path: Path, key: str) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", records(6))
    value: Any = "rouge" if key == "metric" else ["rouge"]
    with pytest.raises(DomainError) as info:
        load_domain(small_config(path, **{key: value}))
    message = str(info.value)
    assert f"Domain 'tiny', {key}: Unknown metric 'rouge'. Did you mean 'rouge_l'?" in message
    assert "Available: bleu, exact_match, mmlu_accuracy, non_repetition, numeric_match, rouge_l, token_f1" in message


def test_split_sizes_exceed_pool(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", records(10))
    with pytest.raises(DomainError) as info:
        load_domain(small_config(path, calibration_size=16, validation_size=16, heldout_size=48))
    message = str(info.value)
    assert (
        "calibration_size + validation_size + heldout_size = 16 + 16 + 48 = 80 exceeds the pool "
        "of 10 records (pool_size=80" in message
    )
    assert "lower the split sizes so that they sum to at most the pool, or add records" in message
    with pytest.raises(
        DomainError, match=r"2 \+ 0 \+ 3 = 5 exceeds the pool of 4 records \(pool_size=4"
    ):
        load_domain(small_config(path, pool_size=4))
    # The defaults (16 / 16 / 48) need 80 records.
    with pytest.raises(DomainError, match=r"16 \+ 16 \+ 48 = 80 exceeds the pool of 10"):
        load_domain({"name": "d", "data": str(path), "metric": "token_f1"})


def test_three_splits_are_disjoint_and_keep_calibration(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", records(12))
    domain = load_domain(small_config(path, calibration_size=3, validation_size=4, heldout_size=5))
    splits = [domain.split(s) for s in ("calibration", "validation", "heldout")]
    assert [len(s) for s in splits] == [3, 4, 5]
    ids = [ex.id for s in splits for ex in s]
    assert len(set(ids)) == 12
    # Calibration does not depend on the other sizes; validation is what follows it.
    two = load_domain(small_config(path, calibration_size=3, validation_size=0, heldout_size=9))
    assert two.split("calibration") == splits[0] and two.split("validation") == []
    assert two.split("heldout")[:4] == splits[1]


def test_negative_validation_size(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", records(6))
    with pytest.raises(DomainError, match=r"validation_size=-1, expected >= 0"):
        load_domain(small_config(path, validation_size=-1))


def test_record_without_references(tmp_path: Path) -> None:
    rows = records(6)
    rows[2]["references"] = []
    del rows[3]["references"]
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    with pytest.raises(
        DomainError, match=r"d\.jsonl:3: record 'r2' has no references, but metric 'token_f1'"
    ):
        load_domain(small_config(path))


def test_references_must_be_strings(tmp_path: Path) -> None:
    rows = records(6)
    rows[1]["references"] = [1, 2]
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    with pytest.raises(
        DomainError, match=r"d\.jsonl:2: 'references' must be a string or a list of strings"
    ):
        load_domain(small_config(path))


def test_duplicate_ids(tmp_path: Path) -> None:
    rows = records(6)
    rows[4]["id"] = "r1"
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    with pytest.raises(DomainError, match=r"d\.jsonl:5: duplicate id 'r1' \(first at line 2\)"):
        load_domain(small_config(path))


def test_bad_config_keys_and_values(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", records(6))
    with pytest.raises(
        DomainError, match=r"Invalid domain config: .*metrik(.|\n)*Expected keys: name, data"
    ):
        load_domain({**small_config(path), "metrik": "bleu"})
    with pytest.raises(DomainError, match="Invalid domain config"):
        load_domain({"data": str(path)})  # no name
    with pytest.raises(DomainError, match="Invalid domain config"):
        load_domain(small_config(path, max_new_tokens="many"))
    with pytest.raises(DomainError, match=r"calibration_size=0, expected >= 1"):
        load_domain(small_config(path, calibration_size=0))


@pytest.mark.skipif(
    importlib.util.find_spec("datasets") is not None, reason="datasets is installed"
)
def test_hf_data_without_datasets_package() -> None:
    with pytest.raises(DomainError, match="pip install datasets"):
        load_domain({"name": "x", "data": "hf:nq_open:validation"})


def test_hf_data_bad_spec() -> None:
    with pytest.raises(DomainError, match=r"expected 'hf:<dataset>:<split>'"):
        load_domain({"name": "x", "data": "hf:nq_open"})


# --- prompt formatting -------------------------------------------------------------------------

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }} {{ m['content'] }}<|im_end|> {% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant {% endif %}"
)


@pytest.fixture
def tokenizer() -> Any:
    """A word-level fast tokenizer built in code (no files, no network)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["[UNK]", "<s>", "<|im_start|>", "<|im_end|>", "system", "user", "assistant"]
    words += ["be", "brief", "hello", "world"]
    backend = Tokenizer(
        models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token="[UNK]")
    )
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", bos_token="<s>")
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    return tok


EXAMPLE = Example(id="e0", prompt="hello world", references=("x",), fields={})


def test_format_prompt_with_chat_template(tokenizer: Any) -> None:
    tokenizer.chat_template = CHATML
    ids = format_prompt(tokenizer, EXAMPLE, None)
    expected = tokenizer.convert_tokens_to_ids(
        ["<|im_start|>", "user", "hello", "world", "<|im_end|>", "<|im_start|>", "assistant"]
    )
    assert ids.dtype == torch.long and ids.shape == (7,)
    assert ids.tolist() == expected
    with_system = format_prompt(tokenizer, EXAMPLE, "be brief")
    prefix = tokenizer.convert_tokens_to_ids(
        ["<|im_start|>", "system", "be", "brief", "<|im_end|>"]
    )
    assert with_system.tolist() == prefix + expected


def test_format_prompt_without_chat_template(tokenizer: Any) -> None:
    assert not tokenizer.chat_template
    ids = format_prompt(tokenizer, EXAMPLE, None)
    assert ids.dtype == torch.long and ids.dim() == 1
    assert ids.tolist() == tokenizer("hello world")["input_ids"]
    assert ids.tolist()[-2:] == tokenizer.convert_tokens_to_ids(["hello", "world"])
    with_system = format_prompt(tokenizer, EXAMPLE, "be brief")
    assert with_system.tolist() == tokenizer("be brief\n\nhello world")["input_ids"]


def test_format_prompt_shipped_example(tokenizer: Any) -> None:
    tokenizer.chat_template = CHATML
    domain = load_domain(read_domain_config("translation", [CONF_DIR]))
    ids = format_prompt(tokenizer, domain.pool[0], domain.config.system_prompt)
    assert ids.dim() == 1 and ids.numel() > 7


# --- reference_field, reference_pattern (data as users have it) ------------------------------


def test_singular_reference_field_with_gsm8k_pattern(tmp_path: Path) -> None:
    rows = [
        {"id": f"g{i}", "question": f"What is {i} + {i}?", "reference": f"{i} plus {i} is {2 * i}.\n#### {2 * i:,}"}
        for i in range(1000, 1006)
    ]
    path = write_jsonl(tmp_path / "gsm.jsonl", rows)
    domain = load_domain(
        small_config(
            path, prompt_template="{question}", metric="numeric_match",
            reference_field="reference", reference_pattern=r"####\s*(.+)",
        )
    )
    assert [ex.references for ex in domain.pool[:2]] == [("2,000",), ("2,002",)]
    result = domain.metric.score(["The answer is 2000.", "It is 2,003"], [ex.references for ex in domain.pool[:2]])
    assert result.per_example == [1.0, 0.0]


def test_reference_field_accepts_a_bare_number(tmp_path: Path) -> None:
    rows = [{"id": str(i), "prompt": "p", "answer": i} for i in range(5)]
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    domain = load_domain(small_config(path, metric="numeric_match", reference_field="answer"))
    assert domain.pool[3].references == ("3",)


def test_missing_reference_field_names_the_field(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", records(5))
    with pytest.raises(DomainError, match=r"no references.*'answer' \(reference_field\)"):
        load_domain(small_config(path, reference_field="answer"))


def test_reference_pattern_errors(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", records(5))
    with pytest.raises(DomainError, match=r"reference_pattern '\(' is not a valid regular expression"):
        load_domain(small_config(path, reference_pattern="("))
    with pytest.raises(DomainError, match=r"d\.jsonl:1: reference 'ref 0' does not match reference_pattern"):
        load_domain(small_config(path, reference_pattern=r"####\s*(.+)"))


def test_reference_free_shipped_metric(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [{"id": str(i), "prompt": "p"} for i in range(5)])
    domain = load_domain(small_config(path, metric="non_repetition"))
    assert domain.metric.higher_is_better and not domain.metric.needs_references
    assert all(ex.references == () for ex in domain.pool)
