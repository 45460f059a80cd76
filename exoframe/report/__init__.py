from .summary import build_summary, summary_table

__all__ = ["build_summary", "summary_table"]
