"""HTML reports of explain, sweep and validate: one self-contained file each, drawn with plotly from
the same dicts their `--json` prints (`draw` picks the kind; `page` assembles and writes the file)."""
