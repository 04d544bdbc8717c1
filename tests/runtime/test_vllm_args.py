"""The vLLM plugin's request fields and step plan, without vLLM: what a request may ask, and
which tokens run which layers."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from runtime_support import mapping_data

from tss_opt.mapping import mapping_from_data
from tss_opt.runtime.vllm_plugin.plan import LayerCounts, LayerKind, RowSpan, build_plan
from tss_opt.runtime.vllm_plugin.request_args import TSSArgsError, TSSRequest, resolve, resolved

MAPPING = mapping_from_data(mapping_data({"qa": [1], "summarization": [1, 2]}, scopes={"qa": "all"}))


def test_domains_explicit_sets_and_dense():
    assert resolve(None, 4, MAPPING) == TSSRequest()
    assert resolve({"tss_domain": "qa"}, 4, MAPPING) == TSSRequest("qa", (1,), "all", "domain", True)
    # An entry without a recorded scope was searched under the default, verify.
    assert resolve({"tss_domain": "summarization"}, 4, MAPPING).scope == "verify"
    assert resolve({"tss_domain": "poetry"}, 4, MAPPING) == TSSRequest("poetry", (), "verify", "domain", False)
    assert resolve({"tss_domain": "qa"}, 4, None).dense  # no mapping: every domain dense
    assert resolve({"tss_skip": [3, 0]}, 4, MAPPING) == TSSRequest(None, (0, 3), "verify", "explicit", False)
    assert resolve({"tss_skip": [2], "tss_scope": "all", "tss_domain": "qa"}, 4, MAPPING).skip_set == (2,)
    assert resolve({"tss_domain": "qa", "tss_scope": "verify"}, 4, MAPPING).scope == "verify"
    assert resolve({"other_plugin": 1}, 4, MAPPING).dense  # other keys are not ours


@pytest.mark.parametrize(
    ("args", "param", "words"),
    [
        ({"tss_skip": [4]}, "vllm_xargs.tss_skip", "out of range"),
        ({"tss_skip": [-1]}, "vllm_xargs.tss_skip", "valid indices are 0..3"),
        ({"tss_skip": "3"}, "vllm_xargs.tss_skip", "list of layer indices"),
        ({"tss_skip": [1.0]}, "vllm_xargs.tss_skip", "list of layer indices"),
        ({"tss_skip": [True]}, "vllm_xargs.tss_skip", "list of layer indices"),
        ({"tss_skip": [1, 1]}, "vllm_xargs.tss_skip", "twice"),
        ({"tss_scope": "most"}, "vllm_xargs.tss_scope", "verify, all"),
        ({"tss_domain": 3}, "vllm_xargs.tss_domain", "non-empty string"),
        ({"tss_domain": " "}, "vllm_xargs.tss_domain", "non-empty string"),
        ({"tss_skp": [1]}, "vllm_xargs.tss_skp", "unknown TSS field"),
    ],
)
def test_malformed_fields_name_the_field(args, param, words):
    with pytest.raises(TSSArgsError, match=words) as e:
        resolve(args, 4, MAPPING)
    assert e.value.param == param and isinstance(e.value, ValueError)


def test_salts_keep_skip_sets_and_scopes_apart():
    salts = {resolve(a, 4, MAPPING).cache_salt() for a in (
        {"tss_skip": [1]}, {"tss_skip": [1], "tss_scope": "all"}, {"tss_skip": [1, 2]}, {"tss_skip": [2, 1]},
    )}
    assert salts == {"tss:verify:1", "tss:all:1", "tss:verify:1,2"}
    assert resolve({"tss_domain": "poetry"}, 4, MAPPING).cache_salt() is None  # dense: plain vLLM's blocks


def test_the_resolved_form_round_trips_and_never_raises():
    req = resolve({"tss_domain": "qa"}, 4, MAPPING)
    assert resolved({"tss": req.to_extra()}) == req
    for junk in (None, {}, {"tss": 3}, {"tss": {"skip": ["x"]}}, {"tss": {"skip": [1], "scope": "most"}}):
        assert resolved(junk) is None


def _plan(rows, positions, num_tokens=None, layers=4):
    n = rows[-1].end
    return build_plan(rows, np.asarray(positions, dtype=np.int64), num_tokens or n, layers, "cpu")


def test_a_step_without_skips_has_no_plan():
    assert _plan([RowSpan(0, 3, (), "all", 2)], [0, 1, 2]) is None
    # verify scope, the whole row still in its prompt: nothing skips yet
    assert _plan([RowSpan(0, 3, (1,), "verify", 5)], [0, 1, 2]) is None


def test_verify_scope_skips_only_positions_past_the_prompt():
    # One row: its last prompt chunk (positions 3, 4) and... a decode row of another request.
    rows = [RowSpan(0, 2, (1,), "verify", 5), RowSpan(2, 3, (1,), "verify", 5)]
    plan = _plan(rows, [3, 4, 7])
    assert plan.kinds == [LayerKind.dense, LayerKind.mixed, LayerKind.dense, LayerKind.dense]
    assert plan.kept[1].tolist() == [0, 1] and plan.skipped_tokens == [0, 1, 0, 0]
    # The same rows under scope all: every token skips layer 1, which then does not run.
    plan = _plan([RowSpan(0, 2, (1,), "all", 5), RowSpan(2, 3, (1,), "all", 5)], [3, 4, 7])
    assert plan.kinds[1] is LayerKind.skip and plan.kept == {}


def test_mixed_layers_share_index_tensors_and_padding_follows_the_kept_tokens():
    rows = [RowSpan(0, 1, (), "all", 1), RowSpan(1, 3, (1, 2), "all", 1), RowSpan(3, 4, (2,), "all", 1)]
    plan = _plan(rows, [5, 6, 7, 9], num_tokens=6)
    assert plan.kinds == [LayerKind.dense, LayerKind.mixed, LayerKind.mixed, LayerKind.dense]
    assert plan.kept[1].tolist() == [0, 3, 4, 5]  # padding tokens 4, 5 run with the kept ones
    assert plan.kept[2].tolist() == [0, 4, 5]
    same = _plan([RowSpan(0, 1, (), "all", 1), RowSpan(1, 2, (1, 2), "all", 1)], [3, 4])
    assert same.kept[1] is same.kept[2]  # one pattern, one tensor
    assert plan.kept[1].dtype == torch.long


def test_layer_counts_add_up():
    counts = LayerCounts(4)
    counts.add(None, 3)
    counts.add(_plan([RowSpan(0, 2, (1,), "all", 1), RowSpan(2, 3, (), "all", 1)], [1, 2, 5]), 3)
    assert counts.steps == 2 and counts.tokens == 6
    assert counts.dense == [2, 1, 2, 2] and counts.mixed == [0, 1, 0, 0] and counts.tokens_skipped == [0, 2, 0, 0]


def test_on_a_cpu_the_thread_counts_are_left_to_vllm(caplog):
    from tss_opt.runtime.vllm_plugin.launch import VLLMLaunch

    base = {"OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2", "PATH": "/bin"}
    launch = VLLMLaunch(model_dir="m", served_model_name="m", model_id="m", dtype="float32", host="127.0.0.1", port=1)
    with caplog.at_level("INFO", logger="tss_opt.runtime.vllm_plugin.launch"):
        cpu = VLLMLaunch(**{**launch.__dict__, "cpu": True}).env(base)
    # vLLM's CPU worker binds its threads to cores; a count from the environment oversubscribes them.
    assert "OMP_NUM_THREADS" not in cpu and "MKL_NUM_THREADS" not in cpu and cpu["PATH"] == "/bin"
    assert "OMP_NUM_THREADS=2" in caplog.text
    assert launch.env(base)["OMP_NUM_THREADS"] == "2"  # a GPU build: the environment as it is
    assert base["OMP_NUM_THREADS"] == "2"  # the caller's mapping is not changed


def test_on_a_cpu_the_kv_cache_is_sized_unless_the_user_sizes_it():
    from tss_opt.runtime.vllm_plugin.launch import VLLMLaunch

    launch = VLLMLaunch(model_dir="m", served_model_name="m", model_id="m", dtype="float32", host="127.0.0.1",
                        port=1, cpu=True)
    # vLLM's CPU default reserves 92 % of memory and refuses to start beside other processes.
    assert launch.env({})["VLLM_CPU_KVCACHE_SPACE"] == "4"
    assert launch.env({"VLLM_CPU_KVCACHE_SPACE": "12"})["VLLM_CPU_KVCACHE_SPACE"] == "12"
    own = VLLMLaunch(**{**launch.__dict__, "vllm_args": ("--gpu-memory-utilization=0.5",)})
    assert "VLLM_CPU_KVCACHE_SPACE" not in own.env({})
    assert "VLLM_CPU_KVCACHE_SPACE" not in VLLMLaunch(**{**launch.__dict__, "cpu": False}).env({})
