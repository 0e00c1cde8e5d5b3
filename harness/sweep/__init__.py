"""Sweeps: a file that says what to run (`spec`), the cells it makes (`plan`), running them several at a
time (`run`, over `harness.parallel`), reading a finished run back (`cells`), lining it up with a baseline
(`compare`), the dry run (`dryrun`) and the command (`cli`: `pdchaos sweep`). Shipped sweep files live in
`scenarios/sweeps/` and are found by name."""
