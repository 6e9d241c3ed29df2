"""What runs leave behind: run directories, CSV logs, tables, plots, and ``tlab report``."""
