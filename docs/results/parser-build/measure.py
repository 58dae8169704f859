"""CPU seconds to build the command line's parser, with docstring_parser's readings kept (`config.parsed_doc`, as
mixit runs) and with them cleared before every build (as before they were kept). Run from the repository root:

.venv/bin/python docs/results/parser-build/measure.py > docs/results/parser-build/measure.txt
"""

import time

from mixit import cli
from mixit.core import config


def seconds_per_build(clear: bool, builds: int = 5) -> float:
    cli.build_parser()
    start = time.process_time()
    for _ in range(builds):
        if clear:
            config._PARSED.clear()
        cli.build_parser()
    return (time.process_time() - start) / builds


cold, warm = seconds_per_build(clear=True), seconds_per_build(clear=False)
print(f"re-read every build: {cold:.3f} s; kept: {warm:.3f} s; ratio {cold / warm:.1f}")
