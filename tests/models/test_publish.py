"""Model folders are published atomically, also with other processes writing the same one."""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path

from tss_opt.models.publish import publish_dir, staging_dir


def _complete(d: Path) -> bool:
    return (d / "weights").is_file()


def _write_and_publish(out: str, tag: str, barrier) -> None:  # noqa: ANN001 - a Barrier proxy
    tmp = staging_dir(Path(out))
    (tmp / "weights").write_text(tag)
    barrier.wait()  # all writers publish together
    publish_dir(tmp, Path(out), _complete)


def test_concurrent_writers_leave_one_complete_folder(tmp_path: Path) -> None:
    out = tmp_path / "model"
    ctx = mp.get_context("spawn")
    barrier = ctx.Manager().Barrier(4)
    procs = [ctx.Process(target=_write_and_publish, args=(str(out), f"w{i}", barrier)) for i in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    assert (out / "weights").read_text() in {"w0", "w1", "w2", "w3"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # no staging folder left


def test_an_incomplete_folder_is_replaced_and_a_complete_one_kept(tmp_path: Path) -> None:
    out = tmp_path / "model"
    out.mkdir()
    (out / "stale").write_text("half written by an older version")
    tmp = staging_dir(out)
    (tmp / "weights").write_text("new")
    publish_dir(tmp, out, _complete)
    assert sorted(p.name for p in out.iterdir()) == ["weights"]

    again = staging_dir(out)
    (again / "weights").write_text("later")
    publish_dir(again, out, _complete)
    assert (out / "weights").read_text() == "new" and not again.exists()
