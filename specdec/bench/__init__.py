"""The Spec-Bench runner: every method (the project's drafters and the transformers peers) on the
same target, machine and questions in one run, so the ratios it reports are comparable.

    questions.py  Spec-Bench questions (first turn), grouped into its six reported categories
    methods.py    the method registry (names, what each is compared against) and how each runs
    runner.py     the timed loop (methods interleaved per question) and the greedy equality check
    report.py     per method per category figures, JSON and Markdown
    plots.py      speedup against acceptance rate; speedup per category per method
    main.py       one call from options to files on disk (what `specdec bench` runs)
    workloads.py, workload_bench.py, workload_report.py
                  the project's own workload prompts per workload (`specdec bench --workloads`)
"""
