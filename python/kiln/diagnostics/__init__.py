"""kiln's diagnostics, behind the `logged_api` decorator (kiln/api_logging.py) and `python -m kiln`.

    settings     the KILN_LOGLEVEL / KILN_LOGDEST / KILN_DUMP* / KILN_FORCE_BACKEND values, validated
    sink         the log destination: each record written, flushed and fsync'ed before the call runs
    describe     arguments as text: tensor metadata, statistics, CUDA-graph-capture detection
    call         the wrapper `logged_api` returns when diagnostics are on: one logged call
    record       values <-> JSON + safetensors (the dump format), tensor layouts rebuilt exactly
    dump         bounded, filtered dumps of calls into KILN_DUMP_DIR
    provenance   what a record says about where a call ran: device, arch, module, cache key, env
    force        KILN_FORCE_BACKEND: run a call on another backend, copying tensors there and back
    replay       `python -m kiln replay`: re-run a dumped call and compare with its outputs
    env_report   `python -m kiln env`: what a bug report needs to say about this machine

None of this is imported while diagnostics are off (KILN_LOGLEVEL=0, no dumps, no forced backend),
except `settings`, which the decorator reads once per API at import time.
"""
