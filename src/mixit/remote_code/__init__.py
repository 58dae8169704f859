"""The transformers classes a ``--to hub`` export ships for ``trust_remote_code`` (`mixit.export.remote_code`): they
wrap mixit's own `Transformer`, and the export ships them with the mixit modules they import, those imports made
relative, so the export loads with transformers alone (``AutoModelForCausalLM.from_pretrained(DIR,
trust_remote_code=True)``)."""
