"""The LLM serving plan (``hpurecipe serving-plan``): vLLM-Gaudi's bucket grid (``buckets``), a request trace
(``trace``), memory and warm-up time per bucket (``plan``), continuous batching over the trace
(``simulate``) and the recommended bucket settings (``recommend``)."""
