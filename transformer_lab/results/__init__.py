"""What runs leave behind: run directories and CSV logs (``run_directory``), PASS/FAIL check
rows (``check_rows``), terminal output (``console``), plots, and ``tlab report`` over many runs
(``gather``, ``report``, ``report_plots``, ``verdicts``)."""
