"""The run records' one schema: typed records for summary.json, metrics.jsonl's rows,
trace.json and a rank's result, their JSON Schemas (shipped beside this module, and in
docs/schemas/), exoframe.load_run, and validate_run_folder (a run folder's records checked
against those schemas). Below engine/ and report/, which both use it; it
imports no torch."""
from .codec import SCHEMA_VERSION, Record, with_version
from .reading import RunRecords, load_run
from .run_records import (FailureRecord, RankResult, RankSummary, Row, RunSummary,
                          StoppedSummary, Trace, Traffic, Validation, summary_from_json)
from .validating import validate_run_folder

__all__ = ["SCHEMA_VERSION", "Record", "RunRecords", "load_run", "FailureRecord",
           "RankResult", "RankSummary", "Row", "RunSummary", "StoppedSummary", "Trace",
           "Traffic", "Validation", "summary_from_json", "validate_run_folder", "with_version"]
