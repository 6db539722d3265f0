"""Each lesson's own helpers, a module per topic; each module's docstring names the lesson that introduces it. Imports the core and display."""
