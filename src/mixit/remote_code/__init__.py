"""The code an exported MixiT (or any ``--to hub``) directory ships for ``trust_remote_code``
(`mixit.export`): copied beside the weights as they are. Neither file imports mixit, so the export loads
with transformers alone (``AutoModel.from_pretrained(DIR, trust_remote_code=True)``)."""
