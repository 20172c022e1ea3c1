# Sphinx configuration for hbmcoll's documentation: Markdown pages read by myst-parser.
# Build: make docs (python3 -m sphinx -W --keep-going -q -b html docs build/docs)
project = "hbmcoll"
copyright = "hbmcoll's authors, BSD-3-Clause"
extensions = ["myst_parser"]
source_suffix = {".md": "markdown"}
root_doc = "index"
# the build directories, if a build is ever pointed inside docs/
exclude_patterns = ["_build", "build", "Thumbs.db", ".DS_Store"]
# anchors for headings down to ###, so pages can link to each other's sections (api.md#from-c)
myst_heading_anchors = 3
html_theme = "alabaster"  # ships with Sphinx: nothing to download
