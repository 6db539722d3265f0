"""workbench: the tools beside the workbook, which authors, teachers and the Makefile run.

Students never import it: the lessons import ``lessonkit`` only, and lessonkit never imports this
package. Each tool is a module with a ``main(argv)``; ``python -m workbench --help`` lists them and
``python -m workbench TOOL --help`` gives one tool's own help (``workbench/__main__.py``)."""
