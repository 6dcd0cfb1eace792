"""The passes: one file per pass, named like its pipeline name (`remat-partial-eval` is
`remat_partial_eval.py`); `base` (what every pass shares), `registry` (passes by name)
and `manager` (the pipeline runner: parsing, verification, IR dumps).
"""
