"""T2D: search, distillation, saved drafter, losslessness, bad input and interrupted training.

One small training run on a 6-layer tiny random Llama (module fixture, about a second) feeds
most tests; the drafter it saves is loaded back through the registry exactly as a command
would (``drafter=draft_model`` with the written snippet, and ``drafter=t2d``).
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
import yaml
from omegaconf import OmegaConf
from transformers import LlamaConfig, LlamaForCausalLM

from tss_opt.decoding.drafters import DrafterConfigError, build_drafter
from tss_opt.decoding.engine import SpeculativeEngine
from tss_opt.decoding.skip import SkipController
from tss_opt.decoding.target import TargetModel
from tss_opt.models import LoadedModel, ModelConfig, load_model
from tss_opt.models.tiny import build_tiny_tokenizer
from tss_opt.training import t2d, t2d_search, t2d_student
from tss_opt.training.t2d import (
    T2DError,
    T2DReport,
    T2DSettings,
    build_student,
    speedup_estimate,
    train_t2d,
)

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "decoding"))
from reference import greedy_dense_prefill, greedy_no_cache  # noqa: E402

TEXTS = [
    "the cat sat on the mat. the cat sat on the hat. the dog sat on the log.",
    "Summarize: the quick brown fox jumps over the lazy dog, again and again.",
    "one two three four five six seven eight nine ten eleven twelve thirteen",
]
N_NEW = 32


def small_settings(**overrides: object) -> T2DSettings:
    base = dict(
        min_layers=3, max_layers=3, trials=6, objective="kl", steps=40, lr=3e-3, continuation_tokens=8, teacher_top_k=400,
        save_every=20, latency_reps=3, probe_new_tokens=16,
    )
    base.update(overrides)
    return T2DSettings(**base)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def tiny6() -> LoadedModel:
    return load_model(ModelConfig(name="tiny6", source="tiny", num_layers=6, seed=0))


@pytest.fixture(scope="module")
def prompt(tiny6: LoadedModel) -> torch.Tensor:
    return torch.tensor(tiny6.tokenizer("the cat sat on the", add_special_tokens=False)["input_ids"])


@pytest.fixture(scope="module")
def trained(tiny6: LoadedModel, tmp_path_factory: pytest.TempPathFactory) -> T2DReport:
    out = tmp_path_factory.mktemp("t2d") / "drafter"
    # Probe: the first training text, whose target continuation the drafter was trained on.
    probe = tiny6.tokenizer(TEXTS[0], add_special_tokens=False)["input_ids"]
    return train_t2d(tiny6, TEXTS, small_settings(), out, progress=False, probe_prompts=[probe])


# ----------------------------------------------------------------------------- search
def test_speedup_estimate_exact_values() -> None:
    assert speedup_estimate(0.0, 0.5, 4) == pytest.approx(1 / 3)  # nothing accepted: pure overhead
    assert speedup_estimate(1.0, 0.0, 4) == pytest.approx(5.0)  # free drafts, all accepted
    assert speedup_estimate(0.5, 0.0, 1) == pytest.approx(1.5)  # (1 - a^2) / (1 - a)
    assert speedup_estimate(0.8, 0.1, 5) == pytest.approx((1 - 0.8**6) / 0.2 / 1.5)


def test_search_keeps_the_right_number_of_layers(tiny6: LoadedModel) -> None:
    settings = small_settings(min_layers=2, max_layers=4, trials=8, objective="speedup")
    texts = t2d_search.prepare_texts(tiny6, TEXTS, settings)
    keep, records, target_s = t2d_search.search_keep_set(tiny6, texts, settings, progress=False)
    assert len(records) == 8 and target_s > 0
    # The enqueued seeds come first: layers spread evenly, then first and last halves, at the
    # smallest count (both [0, 5]) and at the largest.
    assert [r.keep for r in records[:3]] == [[0, 5], [0, 2, 3, 5], [0, 1, 4, 5]]
    for r in records:
        assert 2 <= len(r.keep) <= 4 and r.keep[0] == 0 and r.keep[-1] == 5  # first/last pinned
        assert 0.0 <= r.agreement <= 1.0 and r.latency_ms > 0 and r.latency_ratio > 0
        assert r.speedup == pytest.approx(speedup_estimate(r.agreement, r.latency_ratio, settings.draft_tokens))
        assert r.value == r.speedup and r.kl >= 0
    assert keep == max(records, key=lambda r: (r.speedup, -len(r.keep))).keep
    # The recorded agreement is the self-drafter's: the target with the other layers skipped.
    r = records[-1]
    skip = [i for i in range(6) if i not in r.keep]
    with SkipController.for_model(tiny6.model).apply(skip), torch.no_grad():
        hits = sum(int((tiny6.model(input_ids=t.ids[None]).logits[0].argmax(-1) == t.top_idx[:, 0]).sum()) for t in texts)
    assert r.agreement == pytest.approx(hits / sum(t.ids.numel() for t in texts))


def test_kl_objective_keeps_the_lowest_kl(tiny6: LoadedModel) -> None:
    settings = small_settings(objective="kl", trials=5)
    texts = t2d_search.prepare_texts(tiny6, TEXTS, settings)
    keep, records, _ = t2d_search.search_keep_set(tiny6, texts, settings, progress=False)
    assert all(r.value == -r.kl for r in records)
    assert keep == min(records, key=lambda r: r.kl).keep


def test_fixed_count_without_pinning(tiny6: LoadedModel) -> None:
    settings = small_settings(min_layers=1, max_layers=1, keep_first_last=False, trials=4)
    texts = t2d_search.prepare_texts(tiny6, TEXTS[:1], settings)
    _, records, _ = t2d_search.search_keep_set(tiny6, texts, settings, progress=False)
    assert [len(r.keep) for r in records] == [1, 1, 1, 1]


# ----------------------------------------------------------------------------- student
def test_student_is_the_self_drafter_before_training(tiny6: LoadedModel, prompt: torch.Tensor) -> None:
    keep = [0, 2, 5]
    student = build_student(tiny6.model, keep)
    assert student.config.num_hidden_layers == 3 and tiny6.model.config.num_hidden_layers == 6
    with torch.no_grad():
        got = student(input_ids=prompt[None]).logits
        with SkipController.for_model(tiny6.model).apply([1, 3, 4]):
            want = tiny6.model(input_ids=prompt[None]).logits
    torch.testing.assert_close(got, want)


def test_tied_embeddings_stay_tied(tmp_path: Path) -> None:
    cfg = LlamaConfig(vocab_size=259, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    student = build_student(model, [0, 3])
    assert student.lm_head.weight is student.model.embed_tokens.weight
    t2d_student.save_checkpoint(student, build_tiny_tokenizer(), tmp_path, {"step": 0}, torch.float32)
    from safetensors import safe_open

    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        assert "lm_head.weight" not in f.keys()  # stored once
    loaded = load_model({"name": "t", "source": "hf", "path": str(tmp_path), "num_layers": 2})
    assert loaded.model.lm_head.weight.data_ptr() == loaded.model.model.embed_tokens.weight.data_ptr()
    torch.testing.assert_close(loaded.model.model.embed_tokens.weight, model.model.embed_tokens.weight)


# ----------------------------------------------------------------------- distillation
def test_distillation_lowers_kl_and_raises_agreement(trained: T2DReport) -> None:
    assert trained.steps == 40 and len(trained.loss_curve) == 40
    assert trained.kl_after < 0.5 * trained.kl_before
    assert trained.agreement_after >= trained.agreement_before  # vs the self-drafter, same layers
    assert trained.agreement_after > trained.agreement_before + 0.2
    assert len(trained.keep_layers) == 3 and sorted(trained.keep_layers + trained.skip_layers) == list(range(6))
    assert len(trained.candidates) == 6 and trained.latency_ratio > 0
    saved = json.loads((Path(trained.out_dir) / t2d.REPORT_FILE).read_text())
    assert saved["keep_layers"] == trained.keep_layers and saved["steps"] == 40
    state = json.loads((Path(trained.out_dir) / t2d.STATE_FILE).read_text())
    assert state["step"] == 40 and state["keep_layers"] == trained.keep_layers


def test_probe_compares_with_the_self_drafter(trained: T2DReport) -> None:
    # On text it was trained on, the distilled drafter is accepted more than the self-drafter
    # with the same layers; both are lossless.
    (row,) = trained.probe or []
    assert row["self_lossless"] and row["t2d_lossless"]
    assert row["t2d_accept_length"] > row["self_accept_length"]


def _from_snippet(trained: T2DReport, tiny6: LoadedModel, target: TargetModel):
    snippet = yaml.safe_load((Path(trained.out_dir) / t2d.DRAFTER_FILE).read_text())["drafter"]
    assert snippet == trained.drafter_config and snippet["model"]["num_layers"] == 3
    return build_drafter({**snippet, "num_tokens": 4}, target, tiny6)


@pytest.mark.parametrize("skip", [(), (2,), (1, 4)])
@pytest.mark.parametrize("scope", ["verify", "all"])
def test_saved_drafter_is_lossless(trained, tiny6, prompt, skip, scope) -> None:
    target = TargetModel(tiny6.model)
    if skip:
        ref = (greedy_no_cache if scope == "all" else greedy_dense_prefill)(tiny6.model, prompt, N_NEW, skip)
        assert ref != greedy_no_cache(tiny6.model, prompt, N_NEW), "the skip set must change the output"
    else:
        ref = greedy_no_cache(tiny6.model, prompt, N_NEW)
    drafter = _from_snippet(trained, tiny6, target)
    out = SpeculativeEngine(target, drafter).generate(prompt, max_new_tokens=N_NEW, skip=skip, scope=scope)
    assert out.tokens.tolist() == ref
    if not skip:
        assert out.stats.draft_accepted > 0  # the drafts were really used


def test_t2d_drafter_config_loads_the_folder(trained, tiny6, prompt) -> None:
    cfg = OmegaConf.to_container(OmegaConf.load(REPO / "conf" / "drafter" / "t2d.yaml"))
    target = TargetModel(tiny6.model)
    drafter = build_drafter({**cfg, "path": trained.out_dir}, target, tiny6)
    out = SpeculativeEngine(target, drafter).generate(prompt, max_new_tokens=N_NEW)
    assert out.tokens.tolist() == greedy_no_cache(tiny6.model, prompt, N_NEW)


# --------------------------------------------------------------------------- bad input
def test_yaml_train_section_is_the_settings_defaults() -> None:
    cfg = OmegaConf.to_container(OmegaConf.load(REPO / "conf" / "drafter" / "t2d.yaml"))
    assert cfg["train"] == asdict(T2DSettings())
    assert T2DSettings.from_mapping(OmegaConf.create(cfg["train"])) == T2DSettings()


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"trials": 0}, r"trials=0 is invalid; expected at least 1 search trial \(a zero budget"),
        ({"steps": 0}, r"steps=0 is invalid; expected at least 1 distillation step"),
        ({"search_minutes": 0}, r"search_minutes=0 is invalid; expected a positive number of minutes"),
        ({"train_minutes": -1.0}, r"train_minutes=-1.0 is invalid"),
        ({"batch_size": 0}, r"batch_size=0 is invalid; expected an integer >= 1"),
        ({"sampler": "cmaes"}, r"sampler='cmaes' is invalid; expected tpe or random"),
        ({"objective": "acc"}, r"objective='acc' is invalid; expected speedup or kl"),
        ({"lr": 0.0}, r"lr=0.0 is invalid"),
    ],
)
def test_bad_settings(kwargs: dict, match: str) -> None:
    with pytest.raises(T2DError, match=match):
        T2DSettings(**kwargs)


def test_bad_layer_ranges(tiny6: LoadedModel, tmp_path: Path) -> None:
    with pytest.raises(T2DError, match=r"max_layers=6 keeps every layer of the 6-layer target.*max_layers <= 5"):
        train_t2d(tiny6, TEXTS, T2DSettings(max_layers=6), tmp_path)
    with pytest.raises(T2DError, match=r"min_layers=4 exceeds max_layers=3"):
        T2DSettings(min_layers=4, max_layers=3).layer_range(6)
    with pytest.raises(T2DError, match=r"min_layers=1 is below the 2 layers keep_first_last pins"):
        T2DSettings(min_layers=1, max_layers=2).layer_range(6)
    with pytest.raises(T2DError, match=r"target_skip layer\(s\) \[9\] out of range.*0..5"):
        T2DSettings(target_skip=[9]).layer_range(6)
    with pytest.raises(T2DError, match=r"unknown t2d setting\(s\) trails; the settings are: min_layers"):
        T2DSettings.from_mapping({"trails": 3})
    assert not any(tmp_path.iterdir())  # refused before any work


@pytest.mark.parametrize("texts", [[], ["", "   "], [[5]]])
def test_no_training_text(tiny6: LoadedModel, tmp_path: Path, texts: list) -> None:
    with pytest.raises(T2DError, match=r"t2d has no training text: .*calibration_size >= 1"):
        train_t2d(tiny6, texts, small_settings(), tmp_path / "d")
    assert not (tmp_path / "d").exists()


def test_registry_t2d_errors(tiny6: LoadedModel, tmp_path: Path) -> None:
    target = TargetModel(tiny6.model)
    with pytest.raises(DrafterConfigError, match=r"'t2d' needs drafter.path.*train_drafter"):
        build_drafter({"name": "t2d", "path": "???"}, target, tiny6)
    with pytest.raises(DrafterConfigError, match=r"holds no T2D drafter \(no config.json there\)"):
        build_drafter({"name": "t2d", "path": str(tmp_path)}, target, tiny6)


# ---------------------------------------------------------------------- interruption
class Interrupt(KeyboardInterrupt):
    pass


def _assert_loadable(folder: Path, tiny6: LoadedModel, prompt: torch.Tensor) -> None:
    assert not [p for p in folder.iterdir() if p.name.startswith(".")], "temporary files left behind"
    drafter = build_drafter({"name": "t2d", "path": str(folder), "num_tokens": 3}, TargetModel(tiny6.model), tiny6)
    out = SpeculativeEngine(TargetModel(tiny6.model), drafter).generate(prompt, max_new_tokens=8)
    assert out.tokens.tolist() == greedy_no_cache(tiny6.model, prompt, 8)


def test_interrupted_training_leaves_the_last_checkpoint(tiny6, prompt, tmp_path) -> None:
    def stop(step: int, loss: float) -> None:
        if step == 7:
            raise Interrupt

    with pytest.raises(Interrupt):
        train_t2d(tiny6, TEXTS, small_settings(trials=2, save_every=3), tmp_path, progress=False, step_callback=stop)
    assert json.loads((tmp_path / t2d.STATE_FILE).read_text())["step"] == 6
    assert not (tmp_path / t2d.REPORT_FILE).exists()
    _assert_loadable(tmp_path, tiny6, prompt)


def test_interrupt_while_saving_keeps_the_previous_checkpoint(tiny6, prompt, tmp_path, monkeypatch) -> None:
    real = os.replace
    calls = {"weights": 0}

    def replace(src, dst):  # interrupted just before the 3rd checkpoint's weights move in
        if str(dst).endswith("model.safetensors"):
            calls["weights"] += 1
            if calls["weights"] == 3:
                raise Interrupt
        return real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(Interrupt):
        train_t2d(tiny6, TEXTS, small_settings(trials=2, save_every=3), tmp_path, progress=False)
    monkeypatch.undo()
    assert json.loads((tmp_path / t2d.STATE_FILE).read_text())["step"] == 3  # checkpoints 0, 3 completed
    _assert_loadable(tmp_path, tiny6, prompt)
