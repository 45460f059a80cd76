from .summary import build_run_summary, build_summary, summary_table

__all__ = ["build_run_summary", "build_summary", "summary_table"]
