"""kiln's benchmark harness: one harness for every op and backend.

    python -m benchmarks run <routine|all> [--backends kiln,torch,flashinfer] [--dtype bf16]
                             [--shapes examples|small|<example>[:axis=v,..]|axis=v,..]
                             [--cuda-graph] [--output results.jsonl] [--repro]
    python -m benchmarks list
    python -m benchmarks definitions [--regenerate]
    python -m benchmarks table results.jsonl [--markdown]
    python -m benchmarks plot results.jsonl [-o plot.png]
    python -m benchmarks readme-table results.jsonl [...]

routine.py      the routine and backend interface (what an op adds to be benchmarked)
routines/       the routines: one module per op family, each with a ROUTINES tuple
definitions.py  the committed benchmark definitions (from the trace templates) and their files
selection.py    --shapes: which workloads of which definitions a run covers
harness.py      one run: inputs, reference check, timing, one record per (workload, backend)
timing.py       timers (CUPTI, CUDA events, host wall clock), CUDA-graph replay, statistics
ceilings.py     the measured copy bandwidth and GEMM rate results are compared against
environment.py  device, software and git facts recorded with every result
results.py      the record format, JSON lines in and out (and the interim bench_norm format)
table.py, plot.py, readme.py   renderings of results
compile_time.py cold compile / warm load of a module (a script, run by scripts/gpu_round.sh)
compile_modules.py  cold compile of each module of a label, for one source tree or another
cache_verification.py  what verifying a cached module costs on the warm path
bounds_overhead.py  decode and prefill timed for one source tree (the index checks' cost)
host_overhead.py    per-call host cost of small ops against torch's eager op (CI guards the ratio on CPU)
gemm_tactics.py every GEMM tactic timed at a shape beside the default and cuBLAS (the heuristic's basis)
docs/benchmarks.md explains the fields and how to add a routine.
"""
