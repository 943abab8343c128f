"""The matmul wing: problems and their epilogues (problem.py), block configurations (configs.py), the kernels
(blocked.py generates the register-blocked one, paired.py runs two problems in one dispatch, rows.py a few rows,
lesson.py the lesson's tiles), the choice among them (selection.py, its tuned choices kept by tuning_cache.py) and
the backend's matmul ops (linear.py)."""
