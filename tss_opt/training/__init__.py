"""Training drafters from a target model (``python -m tss_opt.cli.train_drafter``)."""
