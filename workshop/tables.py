"""The Markdown tables that docs quote from results files (see workshop/results.py): one function per
table, registered with @table(results_file, table_name)."""

from workshop.results import table  # noqa: F401
