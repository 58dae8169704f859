"""Test-session environment: no hub calls, and caches kept out of the home directory.

Set at import, before any test imports `datasets` (which reads them once).
"""

import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
_CACHE = tempfile.mkdtemp(prefix="mixit-test-cache-")
os.environ["MIXIT_CACHE"] = os.path.join(_CACHE, "mixit")
os.environ["HF_DATASETS_CACHE"] = os.path.join(_CACHE, "hf-datasets")
