"""tapescope.viz: graphviz pictures and widgets (graphviz and ipywidgets load lazily)."""
