"""`pdchaos incident`: from an outage's evidence (gateway and engine logs, Kubernetes events, a short
timeline) to a scenario that replays it, and a judgement of whether the replay shows the same symptom.

The pipeline is pure up to the scenario file: `bundle` reads files into facts (each citing its file and
line), `infer` turns facts into a plan (topology, settings, faults, load, expected symptom; every element
cited or a named default), `render` writes the plan as a scenario file. `replay` runs it."""
