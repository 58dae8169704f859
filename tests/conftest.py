"""Test-session environment: no hub calls, no telemetry, and caches kept out of the home directory.

Set at import, before any test imports `datasets` (which reads them once).
"""

import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
# One torch thread per process (torch reads this when it starts): the tests' models are tiny, and the tests that
# start study workers, torchrun ranks or commands would otherwise run two threads each on a 2-core machine.
os.environ.setdefault("OMP_NUM_THREADS", "1")
_CACHE = tempfile.mkdtemp(prefix="mixit-test-cache-")
os.environ["MIXIT_CACHE"] = os.path.join(_CACHE, "mixit")
os.environ["HF_DATASETS_CACHE"] = os.path.join(_CACHE, "hf-datasets")
# MLflow reads these at import: no usage reports, and no telemetry.json written under ~/.config.
os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"
os.environ["XDG_CONFIG_HOME"] = os.path.join(_CACHE, "config")
# The Jupyter kernels of tests/test_notebook.py: IPython's profile and the kernels' connection files.
os.environ["IPYTHONDIR"] = os.path.join(_CACHE, "ipython")
os.environ["JUPYTER_RUNTIME_DIR"] = os.path.join(_CACHE, "jupyter-runtime")
# cuBLAS is deterministic only with a fixed workspace, which it reads when CUDA starts: the bit-exact tests of
# tests/test_cuda.py need it (no effect without a GPU).
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
