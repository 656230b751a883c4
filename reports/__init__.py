"""Rows -> CSV (pandas), JUnit XML, HTML, baseline diffs. No metric is computed here."""
