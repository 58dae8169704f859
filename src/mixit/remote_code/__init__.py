"""The transformers classes a ``--to hub`` export ships for ``trust_remote_code`` (`mixit.export.remote_code`)."""
