"""The objectives' names, written once: where a trial result is serialised, they are its keys.

A trial's result travels typed (:class:`~tss_opt.search.algorithm.Measurement`, per prompt
:class:`~tss_opt.search.feasibility.PerPrompt`); these names appear only where it becomes
plain data: the keys of the evaluator's answer (:mod:`tss_opt.search.contract`), the study's
metric names and the order of a trial's values (there the metric's slot takes the task
metric's own name), the stored ``per_prompt`` and bounds, the records of a search result and
the mapping entry's baseline and the report. Stored studies and mapping files carry them:
they never change.

They live in ``config`` because every layer that serialises a trial result may import it
(the evaluator below the search, the search, mapping, report, the server); nothing here
imports anything.
"""

from __future__ import annotations

__all__ = ["ACCEPT_LENGTH", "COST", "METRIC", "OBJECTIVE_NAMES", "PAIRED_OBJECTIVES"]

# In the order of a trial's values (maximize, maximize or minimize, minimize).
OBJECTIVE_NAMES: tuple[str, str, str] = ("accept_length", "metric", "cost")
ACCEPT_LENGTH, METRIC, COST = OBJECTIVE_NAMES
# The objectives measured per prompt and compared with the dense run's (the paired rule).
PAIRED_OBJECTIVES: tuple[str, str] = (ACCEPT_LENGTH, METRIC)
