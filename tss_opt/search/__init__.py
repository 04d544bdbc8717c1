"""The TSS search engine: Algorithm 1 (breadth-first skip-set search) as Optuna trials.

The model is not involved: any *evaluator* (an object with ``num_layers`` that measures a
skip set) can be searched. See ``docs/search.md``.

Main entry points:

- :func:`run_search` runs, joins or resumes a search and returns a :class:`SearchResult`;
- :class:`SearchSettings` holds the settings (Hydra config group ``search``);
- :func:`study_name_for` derives a study name from model, drafter, domain, split, settings;
- :func:`load_result` rebuilds the result of a stored study;
- :class:`BreadthFirstSampler` is the Optuna sampler behind it;
- :func:`validate_candidates` checks the cheapest feasible sets on a validation evaluator
  (unseen prompts); :class:`PairedFeasibility` is the paired, noise-aware feasibility rule.
"""

from __future__ import annotations

from tss_opt.config.search import MODES, SELECTIONS, SearchSettings, SearchSettingsError
from tss_opt.search.algorithm import Measurement, Thresholds, plan_search
from tss_opt.search.contract import Evaluator, EvaluatorError
from tss_opt.search.feasibility import FEASIBILITIES, PairedFeasibility, PerPrompt
from tss_opt.search.identity import StudyMismatchError, settings_hash, study_name_for
from tss_opt.search.result import LevelSummary, SearchResult, TrialRecord
from tss_opt.search.run import SearchError, run_search
from tss_opt.search.sampler import BreadthFirstSampler
from tss_opt.search.stored import load_result
from tss_opt.search.validation import ValidationOutcome, store_validation, validate_candidates
from tss_opt.search.worker import RetryStaleSkipSetCallback

__all__ = [
    "FEASIBILITIES",
    "MODES",
    "SELECTIONS",
    "BreadthFirstSampler",
    "Evaluator",
    "EvaluatorError",
    "LevelSummary",
    "Measurement",
    "PairedFeasibility",
    "PerPrompt",
    "RetryStaleSkipSetCallback",
    "SearchError",
    "SearchResult",
    "SearchSettings",
    "SearchSettingsError",
    "StudyMismatchError",
    "Thresholds",
    "TrialRecord",
    "ValidationOutcome",
    "load_result",
    "plan_search",
    "run_search",
    "settings_hash",
    "store_validation",
    "study_name_for",
    "validate_candidates",
]
