"""TSS inside vLLM: each request on its own skip set, in vLLM's own engine.

A vLLM plugin (``vllm.general_plugins`` entry point ``tss`` -> ``registration.register``, run by
vLLM in every process it starts) that registers ``TssLlamaForCausalLM`` (vLLM's Llama whose decoder
layers follow a per-step skip plan, ``model.py``) and installs three hooks on vLLM's internals
(``adapter.py``: the runner builds the step's plan, the front end checks and resolves each
request's TSS fields, the engine core keeps prefix-cache blocks of different skip sets apart).

Use it through ``python -m tss_opt.cli.serve backend=vllm mapping_path=PATH`` (vLLM's OpenAI
server with the plugin, ``launch.py``), or offline::

    import os
    from vllm import LLM, SamplingParams
    from tss_opt.runtime.vllm_plugin.registration import llm_kwargs

    if __name__ == "__main__":  # vLLM spawns its workers
        llm = LLM(model="storage/models/smollm2_135m", **llm_kwargs("storage/mapping.yaml"))
        out = llm.generate(["Summarize: ..."], SamplingParams(temperature=0, max_tokens=64,
                                                              extra_args={"tss_domain": "summarization"}))

See docs/serving.md ("Serving with vLLM"). The package imports nothing: vLLM loads its parts by
name in processes of its own (``registration.py`` holds those names), so that importing one
part never drags in another.
"""
