"""The passes: one file per pass, named like its pipeline name (`remat-partial-eval` is
`remat_partial_eval.py`); `base` (what every pass shares), `registry` (passes by name),
`manager` (the pipeline runner: parsing, verification, IR dumps), and beside the passes
whose helpers they are `fences` (place-optimization-barriers) and `trial_plans`
(remat-partial-eval's trial plans).
"""
