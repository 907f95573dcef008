"""The model a tool reads: a model file (``model.py`` with ``make_model``, ``make_inputs``, ``AXES`` and the
optional names ``modelfile.py`` documents) or a Hugging Face ``config.json`` read as data (``hfmodels.py``,
``hfschema.py``), loaded into a checked ``ModelSpec`` (``modelspec.py``). Every room above reads models here."""
