"""Sphinx configuration of the verl documentation (MyST Markdown, autodoc, furo), built offline with ``-W``.

Build: ``sphinx-build -W -b html docs docs/_build/html``. Nothing here reaches the network (no intersphinx), so
the docs build in CI and on air-gapped machines alike; the repository root goes on ``sys.path`` so that autodoc
imports the checked-out ``verl`` even when it is not installed.
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

project = "verl"
author = "verl contributors"
copyright = "verl contributors"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
]

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]

# Anchors for `[text](page.md#a-heading)` links, down to third-level headings.
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]

autodoc_member_order = "bysource"
autodoc_typehints = "description"
# "Attributes:" sections become field lists; as attribute directives they would clash with the dataclass fields
# autodoc documents itself (a duplicate-object warning, fatal under -W).
napoleon_use_ivar = True
napoleon_google_docstring = True
napoleon_numpy_docstring = False

html_theme = "furo"
html_title = "verl"
