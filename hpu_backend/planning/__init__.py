"""What a deployment will need, planned without a device: ``capacity.py`` (prefill and decode, the largest batch),
``training_plan.py`` (a training step on N cards), ``serving/`` (a vLLM-Gaudi deployment: its bucket grid, memory,
warm-up and a trace replayed) and ``plan_trace.py`` (each plan as a timeline trace)."""
