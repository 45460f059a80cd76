from .summary import build_run_summary, summary_table

__all__ = ["build_run_summary", "summary_table"]
