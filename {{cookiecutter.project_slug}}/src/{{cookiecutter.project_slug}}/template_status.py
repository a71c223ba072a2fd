"""Moved to `tools/template_status.py` (template release 0.3.0).

A tool of the template's, not of the research code. This stub runs it from there for one
release; it goes in the next.
"""

import runpy
import sys
from pathlib import Path

if __name__ == "__main__":
    tool = Path(__file__).resolve().parents[2] / "tools" / "template_status.py"
    print(f"note: template_status.py moved to {tool}; run that instead", file=sys.stderr)
    runpy.run_path(str(tool), run_name="__main__")
