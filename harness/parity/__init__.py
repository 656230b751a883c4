"""The parity run (``python -m harness run`` / ``repro``): ``suite`` plans op x implementation x case
and runs the plan in worker processes, ``runners`` makes the checks of one (implementation, case)
pair, ``records`` the records of one run, ``stages`` where the time goes, ``repro`` one case again."""
