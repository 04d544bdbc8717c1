"""Shared data of the report tests: a mapping entry's validation record as export writes it."""

VALIDATED_ENTRY = {
    "skip_set": [2, 3],
    "validation": {
        "chosen": [2, 3],
        "reason": "passed validation",
        "dense_kept": False,
        "confidence": 0.9,
        "num_prompts": 16,
        "dense": {"accept_length": 2.0, "metric": 0.5, "cost": 0.5, "n": 16},
        "figures": {
            "accept_length": 2.4,
            "metric": 0.49,
            "cost": 0.2,
            "bounds": {
                "accept_length": {"mean_diff": 0.4, "lower": 0.3, "upper": 0.5, "tolerance": 0.1, "n": 16},
                "metric": {"mean_diff": -0.01, "lower": -0.02, "upper": 0.0, "tolerance": 0.025, "n": 16},
            },
        },
    },
}
