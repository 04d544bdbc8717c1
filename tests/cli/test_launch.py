"""``cli.launch``: one GPU per worker through ``CUDA_VISIBLE_DEVICES``."""

from __future__ import annotations

import pytest

from tss_opt.cli.launch import worker_commands, worker_env
from tss_opt.errors import UsageError


def test_each_worker_sees_only_its_gpu(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    devices = ["cuda:0", "cuda:1", "cpu"]
    cmds = worker_commands(["+domain=qa", "devices=[cuda:0,cuda:1,cpu]", "storage=sqlite:///x.db"], devices)
    assert [c[-1] for c in cmds] == ["device=cuda:0", "device=cuda:0", "device=cpu"]
    assert not any(a.startswith(("devices=", "storage=")) for c in cmds for a in c)
    envs = [worker_env("sqlite:///x.db", d) for d in devices]
    assert envs[0]["CUDA_VISIBLE_DEVICES"] == "0" and envs[1]["CUDA_VISIBLE_DEVICES"] == "1"
    assert "CUDA_VISIBLE_DEVICES" not in envs[2]
    assert all(e["TSS_STORAGE"] == "sqlite:///x.db" for e in envs)


def test_indices_count_among_the_gpus_the_launcher_sees(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert worker_env(None, "cuda:1")["CUDA_VISIBLE_DEVICES"] == "3"
    assert worker_env(None, "cpu")["CUDA_VISIBLE_DEVICES"] == "2,3"  # untouched
    with pytest.raises(UsageError, match="cuda:2 is not visible.*CUDA_VISIBLE_DEVICES=2,3"):
        worker_env(None, "cuda:2")
    with pytest.raises(UsageError, match="'cuda:x' is not a device"):
        worker_env(None, "cuda:x")
