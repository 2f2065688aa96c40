"""The execution engine shared by the filter stage and the evaluation harness (see ``engine/README`` in the
project README): sandboxes, GPU sharing, timing, dispatch, the ledger and the cluster. It imports no filter
and no harness module; a sandbox child runs a job named by its import path."""
