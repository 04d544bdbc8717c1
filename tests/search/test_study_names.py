"""Study names and stored protocols pinned over a wide matrix of configurations.

A study name (and the protocol stored with it) is how a later run finds the trials an
earlier one measured: if refactoring changes a name, every stored study is silently
orphaned and its trials measured again. The expected values below were computed on the code
before the protocol's identity was derived from one declaration, and must never be
regenerated to make this test pass: a setting whose default changes a name needs a
deliberate decision (and the old value kept as the omitted default).

The cases (labels and overrides) are in ``study_name_cases.py``; ``rest`` is a digest of
the stored metadata besides the protocol (model, drafter settings, relaxed settings).
"""

from __future__ import annotations

import pytest
from study_name_cases import BASE as BASE_OVERRIDES
from study_name_cases import cases, identity, settings_cases, settings_identity

# The cases that run without the slow marker: the README's first command and one of each kind
# of protocol key (lossy rule, compile, evaluator kinds, dtype, prompts, length).
FAST = {
    "readme_first_command", "verification=diversed w=0.6", "compile=true", "evaluator=engine",
    "evaluator=replay", "evaluator._target_=custom", "dtype=bfloat16", "prompts=4",
    "max_new_tokens=8", "combo lossy engine",
}

EXPECTED = {
    'readme_first_command': {'name': 'summarization.smollm2_135m.pld.calibration.s15100c7.pc142c', 'protocol': {'prompts': 16, 'max_new_tokens': 24, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32', 'evaluator': 'build_auto_evaluator'}, 'rest': '928d1f953b61'},
    'domain=summarization': {'name': 'summarization.smollm2_135m.pld.calibration.s15100c7.pc142c', 'protocol': {'prompts': 16, 'max_new_tokens': 24, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32', 'evaluator': 'build_auto_evaluator'}, 'rest': '928d1f953b61'},
    'domain=qa': {'name': 'qa.smollm2_135m.pld.calibration.s15100c7.pc142c', 'protocol': {'prompts': 16, 'max_new_tokens': 24, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32', 'evaluator': 'build_auto_evaluator'}, 'rest': 'abf9d60ef656'},
    'domain=translation': {'name': 'translation.smollm2_135m.pld.calibration.s15100c7.pc142c', 'protocol': {'prompts': 16, 'max_new_tokens': 24, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32', 'evaluator': 'build_auto_evaluator'}, 'rest': 'cd4b27770e7e'},
    'domain=mmlu': {'name': 'mmlu.smollm2_135m.pld.calibration.s15100c7.pc142c', 'protocol': {'prompts': 16, 'max_new_tokens': 24, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32', 'evaluator': 'build_auto_evaluator'}, 'rest': 'a358af7f0043'},
    'domain=rag': {'name': 'rag.smollm2_135m.pld.calibration.s15100c7.pc142c', 'protocol': {'prompts': 16, 'max_new_tokens': 24, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32', 'evaluator': 'build_auto_evaluator'}, 'rest': 'dc3279816faa'},
    'search=cpu': {'name': 'summarization.smollm2_135m.pld.calibration.s15100c7.pc142c', 'protocol': {'prompts': 16, 'max_new_tokens': 24, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32', 'evaluator': 'build_auto_evaluator'}, 'rest': '928d1f953b61'},
    'search=paper': {'name': 'summarization.smollm2_135m.pld.calibration.s88a2db3.p24453', 'protocol': {'prompts': 16, 'max_new_tokens': 96, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32', 'evaluator': 'build_auto_evaluator'}, 'rest': 'a559ccb08673'},
    'search=algorithm1': {'name': 'summarization.smollm2_135m.pld.calibration.s210f32d.p24453', 'protocol': {'prompts': 16, 'max_new_tokens': 96, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32', 'evaluator': 'build_auto_evaluator'}, 'rest': 'ec929d8012b4'},
    'mode=exhaustive': {'name': 'summarization.smollm2_135m.pld.calibration.sd0a60bc.p24453', 'protocol': {'prompts': 16, 'max_new_tokens': 96, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32', 'evaluator': 'build_auto_evaluator'}, 'rest': 'a559ccb08673'},
    'mode=beam': {'name': 'summarization.smollm2_135m.pld.calibration.s3bf7e32.p24453', 'protocol': {'prompts': 16, 'max_new_tokens': 96, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32', 'evaluator': 'build_auto_evaluator'}, 'rest': 'a559ccb08673'},
    'mode=sleb': {'name': 'summarization.smollm2_135m.pld.calibration.s6ba6553.p24453', 'protocol': {'prompts': 16, 'max_new_tokens': 96, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32', 'evaluator': 'build_auto_evaluator'}, 'rest': 'a559ccb08673'},
    'mode=gm_skip': {'name': 'summarization.smollm2_135m.pld.calibration.sd83aea6.p24453', 'protocol': {'prompts': 16, 'max_new_tokens': 96, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32', 'evaluator': 'build_auto_evaluator'}, 'rest': 'a559ccb08673'},
    'mode=random': {'name': 'summarization.smollm2_135m.pld.calibration.s749062e.p24453', 'protocol': {'prompts': 16, 'max_new_tokens': 96, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32', 'evaluator': 'build_auto_evaluator'}, 'rest': 'a559ccb08673'},
    'mode=accept_only': {'name': 'summarization.smollm2_135m.pld.calibration.se08471e.p24453', 'protocol': {'prompts': 16, 'max_new_tokens': 96, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32', 'evaluator': 'build_auto_evaluator'}, 'rest': 'a559ccb08673'},
    'mode=metric_only': {'name': 'summarization.smollm2_135m.pld.calibration.s694c86e.p24453', 'protocol': {'prompts': 16, 'max_new_tokens': 96, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32', 'evaluator': 'build_auto_evaluator'}, 'rest': 'a559ccb08673'},
    'mode=tpe': {'name': 'summarization.smollm2_135m.pld.calibration.se5a7850.p24453', 'protocol': {'prompts': 16, 'max_new_tokens': 96, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32', 'evaluator': 'build_auto_evaluator'}, 'rest': 'a559ccb08673'},
    'mode=nsga2': {'name': 'summarization.smollm2_135m.pld.calibration.s57c8090.p24453', 'protocol': {'prompts': 16, 'max_new_tokens': 96, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32', 'evaluator': 'build_auto_evaluator'}, 'rest': 'a559ccb08673'},
    'mode=gp': {'name': 'summarization.smollm2_135m.pld.calibration.s3adea1c.p24453', 'protocol': {'prompts': 16, 'max_new_tokens': 96, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32', 'evaluator': 'build_auto_evaluator'}, 'rest': 'a559ccb08673'},
    'mode=random seed=3': {'name': 'summarization.smollm2_135m.pld.calibration.sac58716.pc142c', 'protocol': {'prompts': 16, 'max_new_tokens': 24, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32', 'evaluator': 'build_auto_evaluator'}, 'rest': '928d1f953b61'},
    'mode=tpe seed=5': {'name': 'summarization.smollm2_135m.pld.calibration.s7974a41.pc142c', 'protocol': {'prompts': 16, 'max_new_tokens': 24, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32', 'evaluator': 'build_auto_evaluator'}, 'rest': '928d1f953b61'},
    'mode=beam seed=3 (not seeded)': {'name': 'summarization.smollm2_135m.pld.calibration.s15100c7.pc142c', 'protocol': {'prompts': 16, 'max_new_tokens': 24, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32', 'evaluator': 'build_auto_evaluator'}, 'rest': '928d1f953b61'},
    'mode=sleb sleb_score=accept_length': {'name': 'summarization.smollm2_135m.pld.calibration.s89c34dc.pc142c', 'protocol': {'prompts': 16, 'max_new_tokens': 24, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32', 'evaluator': 'build_auto_evaluator'}, 'rest': '928d1f953b61'},
    'mode=gm_skip sleb_score=accept_length': {'name': 'summarization.smollm2_135m.pld.calibration.s6dc9f28.pc142c', 'protocol': {'prompts': 16, 'max_new_tokens': 24, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32', 'evaluator': 'build_auto_evaluator'}, 'rest': '928d1f953b61'},
    'drafter=pld': {'name': 'summarization.smollm2_135m.pld.calibration.s15100c7.pc142c', 'protocol': {'prompts': 16, 'max_new_tokens': 24, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32', 'evaluator': 'build_auto_evaluator'}, 'rest': '928d1f953b61'},
    'drafter=samd': {'name': 'summarization.smollm2_135m.samd.calibration.s15100c7.pc142c', 'protocol': {'prompts': 16, 'max_new_tokens': 24, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32', 'evaluator': 'build_auto_evaluator'}, 'rest': '91030d24ed6f'},
    'drafter=token_recycle': {'name': 'summarization.smollm2_135m.token_recycle.calibration.s15100c7.pc142c', 'protocol': {'prompts': 16, 'max_new_tokens': 24, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32', 'evaluator': 'build_auto_evaluator'}, 'rest': 'bc458c363c08'},
    'drafter=eagle': {'name': 'summarization.smollm2_135m.eagle.calibration.s15100c7.pc142c', 'protocol': {'prompts': 16, 'max_new_tokens': 24, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32', 'evaluator': 'build_auto_evaluator'}, 'rest': 'dcd144305196'},
    'drafter=draft_model': {'name': 'summarization.smollm2_135m.draft_model.calibration.s15100c7.pc142c', 'protocol': {'prompts': 16, 'max_new_tokens': 24, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32', 'evaluator': 'build_auto_evaluator'}, 'rest': 'fe44b9c6f253'},
    'drafter=self': {'name': 'summarization.smollm2_135m.self.calibration.s15100c7.pc142c', 'protocol': {'prompts': 16, 'max_new_tokens': 24, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32', 'evaluator': 'build_auto_evaluator'}, 'rest': '5aef80f81aa9'},
    'drafter=t2d': {'name': 'summarization.smollm2_135m.t2d.calibration.s15100c7.pc142c', 'protocol': {'prompts': 16, 'max_new_tokens': 24, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32', 'evaluator': 'build_auto_evaluator'}, 'rest': '482b697a7d8f'},
    'drafter=routed': {'name': 'summarization.smollm2_135m.routed.calibration.s15100c7.pc142c', 'protocol': {'prompts': 16, 'max_new_tokens': 24, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32', 'evaluator': 'build_auto_evaluator'}, 'rest': '1c0289b13d66'},
    'drafter=merged': {'name': 'summarization.smollm2_135m.merged.calibration.s15100c7.pc142c', 'protocol': {'prompts': 16, 'max_new_tokens': 24, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32', 'evaluator': 'build_auto_evaluator'}, 'rest': '8d8815e90cdc'},
    'drafter=samd fallback=none': {'name': 'summarization.smollm2_135m.samd.calibration.s15100c7.pc142c', 'protocol': {'prompts': 16, 'max_new_tokens': 24, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32', 'evaluator': 'build_auto_evaluator'}, 'rest': 'e66ec4869b55'},
    'drafter=pld num_tokens=5': {'name': 'summarization.smollm2_135m.pld.calibration.s15100c7.pc142c', 'protocol': {'prompts': 16, 'max_new_tokens': 24, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32', 'evaluator': 'build_auto_evaluator'}, 'rest': '4e374fc09933'},
    'verification=exact': {'name': 'summarization.smollm2_135m.pld.calibration.s15100c7.pc142c', 'protocol': {'prompts': 16, 'max_new_tokens': 24, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32', 'evaluator': 'build_auto_evaluator'}, 'rest': '928d1f953b61'},
    'verification=diversed': {'name': 'summarization.smollm2_135m.eagle.calibration.s15100c7.p5bffd', 'protocol': {'prompts': 16, 'max_new_tokens': 24, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32', 'verification': 'diversed(w=0.5)', 'evaluator': 'build_auto_evaluator'}, 'rest': '80fb71305beb'},
    'verification=diversed w=0.6': {'name': 'summarization.smollm2_135m.eagle.calibration.s15100c7.p64bc9', 'protocol': {'prompts': 16, 'max_new_tokens': 24, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32', 'verification': 'diversed(w=0.6)', 'evaluator': 'build_auto_evaluator'}, 'rest': 'f9b7229134ab'},
    'verification=diversed weight_policy': {'name': 'summarization.smollm2_135m.eagle.calibration.s15100c7.p80dc0', 'protocol': {'prompts': 16, 'max_new_tokens': 24, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32', 'verification': 'diversed(weight_policy=storage/relaxed/w.json)', 'evaluator': 'build_auto_evaluator'}, 'rest': 'b925e75ee88e'},
    'verification=cospec': {'name': 'summarization.smollm2_135m.draft_model.calibration.s15100c7.p083f3', 'protocol': {'prompts': 16, 'max_new_tokens': 24, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32', 'verification': 'cospec(tau=0.6,0.15)', 'evaluator': 'build_auto_evaluator'}, 'rest': '52b344ea2518'},
    'verification=cospec taus': {'name': 'summarization.smollm2_135m.draft_model.calibration.s15100c7.p2e7dc', 'protocol': {'prompts': 16, 'max_new_tokens': 24, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32', 'verification': 'cospec(tau=0.5,0.2)', 'evaluator': 'build_auto_evaluator'}, 'rest': 'd43a51098fa0'},
    'verification=cospec policy': {'name': 'summarization.smollm2_135m.draft_model.calibration.s15100c7.p61431', 'protocol': {'prompts': 16, 'max_new_tokens': 24, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32', 'verification': 'cospec(policy=storage/relaxed/p.json)', 'evaluator': 'build_auto_evaluator'}, 'rest': '93f5e45d6a29'},
    'exact with relaxed.weight=0.6 (unused)': {'name': 'summarization.smollm2_135m.pld.calibration.s15100c7.pc142c', 'protocol': {'prompts': 16, 'max_new_tokens': 24, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32', 'evaluator': 'build_auto_evaluator'}, 'rest': '928d1f953b61'},
    'verification=diversed pld (identity only)': {'name': 'summarization.smollm2_135m.pld.calibration.s15100c7.p5bffd', 'protocol': {'prompts': 16, 'max_new_tokens': 24, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32', 'verification': 'diversed(w=0.5)', 'evaluator': 'build_auto_evaluator'}, 'rest': '029ab28a968f'},
    'compile=true': {'name': 'summarization.smollm2_135m.pld.calibration.s15100c7.p149ab', 'protocol': {'prompts': 16, 'max_new_tokens': 24, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32', 'compile': True, 'evaluator': 'build_auto_evaluator'}, 'rest': '928d1f953b61'},
    'compile=false': {'name': 'summarization.smollm2_135m.pld.calibration.s15100c7.pc142c', 'protocol': {'prompts': 16, 'max_new_tokens': 24, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32', 'evaluator': 'build_auto_evaluator'}, 'rest': '928d1f953b61'},
    'evaluator=auto': {'name': 'summarization.smollm2_135m.pld.calibration.s15100c7.pc142c', 'protocol': {'prompts': 16, 'max_new_tokens': 24, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32', 'evaluator': 'build_auto_evaluator'}, 'rest': '928d1f953b61'},
    'evaluator=engine': {'name': 'summarization.smollm2_135m.pld.calibration.s15100c7.pdd032', 'protocol': {'prompts': 16, 'max_new_tokens': 24, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32'}, 'rest': '928d1f953b61'},
    'evaluator=replay': {'name': 'summarization.smollm2_135m.pld.calibration.s15100c7.p1c70d', 'protocol': {'prompts': 16, 'max_new_tokens': 24, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32', 'evaluator': 'build_replay_evaluator'}, 'rest': '928d1f953b61'},
    'evaluator=replay batch_size=16': {'name': 'summarization.smollm2_135m.pld.calibration.s15100c7.p1c70d', 'protocol': {'prompts': 16, 'max_new_tokens': 24, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32', 'evaluator': 'build_replay_evaluator'}, 'rest': '928d1f953b61'},
    'evaluator=auto batch_size=4': {'name': 'summarization.smollm2_135m.pld.calibration.s15100c7.pc142c', 'protocol': {'prompts': 16, 'max_new_tokens': 24, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32', 'evaluator': 'build_auto_evaluator'}, 'rest': '928d1f953b61'},
    'evaluator._target_=custom': {'name': 'summarization.smollm2_135m.pld.calibration.s15100c7.p0b8fe', 'protocol': {'prompts': 16, 'max_new_tokens': 24, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32', 'evaluator': 'make_evaluator'}, 'rest': '928d1f953b61'},
    'evaluator=engine _target_=custom': {'name': 'summarization.smollm2_135m.pld.calibration.s15100c7.pdd032', 'protocol': {'prompts': 16, 'max_new_tokens': 24, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32'}, 'rest': '928d1f953b61'},
    'dtype=bfloat16': {'name': 'summarization.smollm2_135m.pld.calibration.s15100c7.pad826', 'protocol': {'prompts': 16, 'max_new_tokens': 24, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'bfloat16', 'evaluator': 'build_auto_evaluator'}, 'rest': '928d1f953b61'},
    'dtype=float16': {'name': 'summarization.smollm2_135m.pld.calibration.s15100c7.pc9105', 'protocol': {'prompts': 16, 'max_new_tokens': 24, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float16', 'evaluator': 'build_auto_evaluator'}, 'rest': '928d1f953b61'},
    'dtype=float64': {'name': 'summarization.smollm2_135m.pld.calibration.s15100c7.p72ecd', 'protocol': {'prompts': 16, 'max_new_tokens': 24, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float64', 'evaluator': 'build_auto_evaluator'}, 'rest': '928d1f953b61'},
    'model.dtype=bfloat16': {'name': 'summarization.smollm2_135m.pld.calibration.s15100c7.pad826', 'protocol': {'prompts': 16, 'max_new_tokens': 24, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'bfloat16', 'evaluator': 'build_auto_evaluator'}, 'rest': '928d1f953b61'},
    'device=cpu': {'name': 'summarization.smollm2_135m.pld.calibration.s15100c7.pc142c', 'protocol': {'prompts': 16, 'max_new_tokens': 24, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32', 'evaluator': 'build_auto_evaluator'}, 'rest': '928d1f953b61'},
    'scope=all': {'name': 'summarization.smollm2_135m.pld.calibration.s15100c7.paaf34', 'protocol': {'prompts': 16, 'max_new_tokens': 24, 'split': 'calibration', 'scope': 'all', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32', 'evaluator': 'build_auto_evaluator'}, 'rest': '928d1f953b61'},
    'cost=measured': {'name': 'summarization.smollm2_135m.pld.calibration.s15100c7.p687e4', 'protocol': {'prompts': 16, 'max_new_tokens': 24, 'split': 'calibration', 'scope': 'verify', 'cost': 'measured', 'temperature': 0.0, 'dtype': 'float32', 'evaluator': 'build_auto_evaluator'}, 'rest': '928d1f953b61'},
    'temperature=0.7': {'name': 'summarization.smollm2_135m.pld.calibration.s15100c7.p80048', 'protocol': {'prompts': 16, 'max_new_tokens': 24, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.7, 'dtype': 'float32', 'evaluator': 'build_auto_evaluator'}, 'rest': '928d1f953b61'},
    'split=validation': {'name': 'summarization.smollm2_135m.pld.validation.s15100c7.p01303', 'protocol': {'prompts': 16, 'max_new_tokens': 24, 'split': 'validation', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32', 'evaluator': 'build_auto_evaluator'}, 'rest': '5962e72cebe0'},
    'split=heldout': {'name': 'summarization.smollm2_135m.pld.heldout.s15100c7.pf645c', 'protocol': {'prompts': 16, 'max_new_tokens': 24, 'split': 'heldout', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32', 'evaluator': 'build_auto_evaluator'}, 'rest': '40fa22a32df4'},
    'prompts=4': {'name': 'summarization.smollm2_135m.pld.calibration.s15100c7.p0b397', 'protocol': {'prompts': 4, 'max_new_tokens': 24, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32', 'evaluator': 'build_auto_evaluator'}, 'rest': '928d1f953b61'},
    'prompts=100 (capped)': {'name': 'summarization.smollm2_135m.pld.calibration.s15100c7.pc142c', 'protocol': {'prompts': 16, 'max_new_tokens': 24, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32', 'evaluator': 'build_auto_evaluator'}, 'rest': '928d1f953b61'},
    'prompts=null': {'name': 'summarization.smollm2_135m.pld.calibration.s15100c7.pc142c', 'protocol': {'prompts': 16, 'max_new_tokens': 24, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32', 'evaluator': 'build_auto_evaluator'}, 'rest': '928d1f953b61'},
    'max_new_tokens=8': {'name': 'summarization.smollm2_135m.pld.calibration.s15100c7.pa4399', 'protocol': {'prompts': 16, 'max_new_tokens': 8, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32', 'evaluator': 'build_auto_evaluator'}, 'rest': '928d1f953b61'},
    'search.max_new_tokens=12': {'name': 'summarization.smollm2_135m.pld.calibration.s15100c7.p629c3', 'protocol': {'prompts': 16, 'max_new_tokens': 12, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32', 'evaluator': 'build_auto_evaluator'}, 'rest': '928d1f953b61'},
    'both lengths': {'name': 'summarization.smollm2_135m.pld.calibration.s15100c7.pa4399', 'protocol': {'prompts': 16, 'max_new_tokens': 8, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32', 'evaluator': 'build_auto_evaluator'}, 'rest': '928d1f953b61'},
    'search=paper lengths from domain': {'name': 'summarization.smollm2_135m.pld.calibration.s88a2db3.p24453', 'protocol': {'prompts': 16, 'max_new_tokens': 96, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32', 'evaluator': 'build_auto_evaluator'}, 'rest': 'a559ccb08673'},
    'reuse_prefill=false': {'name': 'summarization.smollm2_135m.pld.calibration.s15100c7.pc142c', 'protocol': {'prompts': 16, 'max_new_tokens': 24, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32', 'evaluator': 'build_auto_evaluator'}, 'rest': '928d1f953b61'},
    'prefill_store_gib=1': {'name': 'summarization.smollm2_135m.pld.calibration.s15100c7.pc142c', 'protocol': {'prompts': 16, 'max_new_tokens': 24, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32', 'evaluator': 'build_auto_evaluator'}, 'rest': '928d1f953b61'},
    'group_size=1': {'name': 'summarization.smollm2_135m.pld.calibration.s15100c7.pc142c', 'protocol': {'prompts': 16, 'max_new_tokens': 24, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32', 'evaluator': 'build_auto_evaluator'}, 'rest': '928d1f953b61'},
    'selection=triple_win': {'name': 'summarization.smollm2_135m.pld.calibration.s15100c7.pc142c', 'protocol': {'prompts': 16, 'max_new_tokens': 24, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32', 'evaluator': 'build_auto_evaluator'}, 'rest': '928d1f953b61'},
    'validation_candidates=0': {'name': 'summarization.smollm2_135m.pld.calibration.s15100c7.pc142c', 'protocol': {'prompts': 16, 'max_new_tokens': 24, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32', 'evaluator': 'build_auto_evaluator'}, 'rest': '928d1f953b61'},
    'eps_metric_abs=0': {'name': 'summarization.smollm2_135m.pld.calibration.sf00b011.pc142c', 'protocol': {'prompts': 16, 'max_new_tokens': 24, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32', 'evaluator': 'build_auto_evaluator'}, 'rest': '928d1f953b61'},
    'eps_metric_abs=0.01': {'name': 'summarization.smollm2_135m.pld.calibration.s59b69d7.pc142c', 'protocol': {'prompts': 16, 'max_new_tokens': 24, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32', 'evaluator': 'build_auto_evaluator'}, 'rest': '928d1f953b61'},
    'eps_metric=0.1': {'name': 'summarization.smollm2_135m.pld.calibration.sd0e4177.pc142c', 'protocol': {'prompts': 16, 'max_new_tokens': 24, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32', 'evaluator': 'build_auto_evaluator'}, 'rest': '928d1f953b61'},
    'relative=false': {'name': 'summarization.smollm2_135m.pld.calibration.s782e068.pc142c', 'protocol': {'prompts': 16, 'max_new_tokens': 24, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32', 'evaluator': 'build_auto_evaluator'}, 'rest': '928d1f953b61'},
    'feasibility=point': {'name': 'summarization.smollm2_135m.pld.calibration.s34ed0b5.pc142c', 'protocol': {'prompts': 16, 'max_new_tokens': 24, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32', 'evaluator': 'build_auto_evaluator'}, 'rest': '928d1f953b61'},
    'early_stopping=false': {'name': 'summarization.smollm2_135m.pld.calibration.s5ab6f61.pc142c', 'protocol': {'prompts': 16, 'max_new_tokens': 24, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32', 'evaluator': 'build_auto_evaluator'}, 'rest': '928d1f953b61'},
    'futility_stopping=false': {'name': 'summarization.smollm2_135m.pld.calibration.s4c55ee0.pc142c', 'protocol': {'prompts': 16, 'max_new_tokens': 24, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32', 'evaluator': 'build_auto_evaluator'}, 'rest': '928d1f953b61'},
    'max_depth=2 beam_width=4': {'name': 'summarization.smollm2_135m.pld.calibration.s3df8e69.pc142c', 'protocol': {'prompts': 16, 'max_new_tokens': 24, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32', 'evaluator': 'build_auto_evaluator'}, 'rest': '928d1f953b61'},
    'barriers': {'name': 'summarization.smollm2_135m.pld.calibration.se36c01b.pc142c', 'protocol': {'prompts': 16, 'max_new_tokens': 24, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32', 'evaluator': 'build_auto_evaluator'}, 'rest': '928d1f953b61'},
    'study_name given': {'name': 'mine', 'protocol': {'prompts': 16, 'max_new_tokens': 24, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32', 'evaluator': 'build_auto_evaluator'}, 'rest': '928d1f953b61'},
    'model=tiny': {'name': 'summarization.tiny.pld.calibration.s15100c7.pc142c', 'protocol': {'prompts': 16, 'max_new_tokens': 24, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32', 'evaluator': 'build_auto_evaluator'}, 'rest': 'dbeebb28fa5b'},
    'combo lossy engine': {'name': 'qa.smollm2_135m.eagle.calibration.s88a2db3.pd8f1a', 'protocol': {'prompts': 16, 'max_new_tokens': 96, 'split': 'calibration', 'scope': 'all', 'cost': 'measured', 'temperature': 0.0, 'dtype': 'bfloat16', 'verification': 'diversed(w=0.8)', 'compile': True}, 'rest': 'b6750991fe8e'},
    'combo replay': {'name': 'translation.smollm2_135m.draft_model.validation.s6dc9f28.p48071', 'protocol': {'prompts': 8, 'max_new_tokens': 16, 'split': 'validation', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float32', 'evaluator': 'build_replay_evaluator'}, 'rest': '9429bf0d7257'},
    'combo sampling': {'name': 'mmlu.smollm2_135m.token_recycle.calibration.sdb394b0.p98436', 'protocol': {'prompts': 16, 'max_new_tokens': 24, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.5, 'dtype': 'float32', 'compile': True, 'evaluator': 'build_auto_evaluator'}, 'rest': '5c8f539ad290'},
    'combo rag cospec': {'name': 'rag.smollm2_135m.self.calibration.s7336f55.p29072', 'protocol': {'prompts': 16, 'max_new_tokens': 96, 'split': 'calibration', 'scope': 'verify', 'cost': 'analytic', 'temperature': 0.0, 'dtype': 'float16', 'verification': 'cospec(tau=0.6,0.15)', 'evaluator': 'build_auto_evaluator'}, 'rest': 'bb2217753127'},
}
SETTINGS_EXPECTED = {
    'defaults': '83a8bbb',
    'mode=exhaustive': '586539e',
    'mode=beam': 'f51b124',
    'mode=sleb': '9c8124b',

    'mode=gm_skip': 'bc579c4',
    'mode=random': 'b209d84',
    'mode=accept_only': '4e2e722',
    'mode=metric_only': 'ce9aa00',
    'mode=tpe': '2d3e724',
    'mode=nsga2': '9cb7b3d',
    'mode=gp': 'fd842df',
    'random seed=2': 'bd66286',
    'sleb accept': '54bc61c',
    'futility on': '83a8bbb',
    'futility off': '7fdeda2',
    'floor 0.005': '83a8bbb',
    'floor 0': '704c054',
    'paired early': 'dcfaa6d',
    'selection triple_win': '83a8bbb',
}

CASES = dict(cases())


@pytest.fixture(scope="module")
def hydra_once():
    """One Hydra initialisation for the module (composing is what takes the time)."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from tss_opt.config import config_dir, register_configs

    register_configs()
    if GlobalHydra.instance().is_initialized():
        yield
        return
    with initialize_config_dir(version_base="1.3", config_dir=str(config_dir())):
        yield


def test_every_case_is_pinned():
    assert set(CASES) == set(EXPECTED)
    assert {label for label, _ in settings_cases()} == set(SETTINGS_EXPECTED)


@pytest.mark.parametrize(
    "label", [pytest.param(k, marks=() if k in FAST else pytest.mark.slow) for k in CASES]
)
def test_study_name_is_unchanged(label: str, hydra_once) -> None:
    assert identity(CASES[label]) == EXPECTED[label]


@pytest.mark.parametrize("label, values", settings_cases())
def test_settings_hash_is_unchanged(label: str, values: dict) -> None:
    assert settings_identity(values) == SETTINGS_EXPECTED[label]


@pytest.mark.parametrize("override", ["dtype=auto", "model.dtype=auto"])
def test_dtype_auto_names_the_float32_study_on_cpu(override: str, hydra_once) -> None:
    """A search resolves ``dtype=auto`` to float32 on CPU (the precision its exactness rule
    needs, tss_opt/models/precision.py), whatever the CPU's flags: the README's study, unchanged."""
    assert identity([*BASE_OVERRIDES, override]) == EXPECTED["readme_first_command"]
