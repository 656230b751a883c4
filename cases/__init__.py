"""Case catalogs, hypothesis strategies, timelines, mutants and gate data."""
