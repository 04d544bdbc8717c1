"""Run one vLLM engine over a list of request batches and write what it emitted as JSON.

``python vllm_job.py JOB.json OUT.json``. vLLM spawns its own processes and keeps global state
(one engine per process is what it is built for), so the tests start each engine in a process
of its own, through vLLM's offline API (``vllm.LLM``), exactly as a user's script would.

JOB: ``{"model": DIR, "engine": {LLM keyword arguments}, "tss": bool, "mapping": PATH|null,
"model_id": str|null, "batches": [{"name", "prompts": [[ids]], "params": [{SamplingParams
keywords}] (one per prompt, or one for all)}], "counts": bool}``. A batch that raises is
recorded under ``errors`` and the next batch runs (the engine must survive bad input). Each
batch's wall time (``llm.generate``) is recorded under ``seconds`` (the GPU check's speeds).
"""

from __future__ import annotations

import json
import sys
import time


def main(job_path: str, out_path: str) -> None:
    job = json.loads(open(job_path).read())
    t0 = time.perf_counter()
    from vllm import LLM, SamplingParams

    kwargs: dict = {}
    if job.get("tss"):
        from tss_opt.runtime.vllm_plugin.registration import llm_kwargs

        kwargs = llm_kwargs(job.get("mapping"), job.get("model_id"))
    kwargs.update(job.get("engine") or {})  # the job's settings win (enforce_eager=False: the guard)
    llm = LLM(model=job["model"], **kwargs)
    out: dict = {"start_s": time.perf_counter() - t0, "batches": {}, "errors": {}, "prompts": {}, "seconds": {}}
    for batch in job["batches"]:
        params = batch["params"]
        if isinstance(params, dict):
            params = [params] * len(batch["prompts"])
        sps = [SamplingParams(**p) for p in params]
        # A prompt may continue an earlier batch's row: its prompt, its output, then more ids
        # ({"after": [batch, row], "then": [ids]}): a later turn of a conversation.
        prompts = []
        for ids in batch["prompts"]:
            if isinstance(ids, dict):
                name, row = ids["after"]
                ids = [*out["prompts"][name][row], *out["batches"][name][row]["tokens"], *ids["then"]]
            prompts.append({"prompt_token_ids": ids})
        out["prompts"][batch["name"]] = [p["prompt_token_ids"] for p in prompts]
        t1 = time.perf_counter()
        try:
            results = llm.generate(prompts, sps, use_tqdm=False)
        except Exception as e:  # noqa: BLE001 - recorded for the test to check
            out["errors"][batch["name"]] = f"{type(e).__name__}: {e}"
            continue
        out["seconds"][batch["name"]] = time.perf_counter() - t1
        rows = []
        for r in results:
            o = r.outputs[0]
            row = {"tokens": list(o.token_ids)}
            if o.logprobs is not None:  # per position: the top logprobs {token: logprob}
                row["logprobs"] = [{str(t): float(lp.logprob) for t, lp in pos.items()} for pos in o.logprobs]
            rows.append(row)
        out["batches"][batch["name"]] = rows
    if job.get("counts"):
        out["counts"] = llm.collective_rpc("tss_layer_counts")[0]
    if job.get("metrics"):  # needs engine disable_log_stats=False
        out["metrics"] = {m.name: m.value for m in llm.get_metrics() if hasattr(m, "value")}
    out["total_s"] = time.perf_counter() - t0
    with open(out_path, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
